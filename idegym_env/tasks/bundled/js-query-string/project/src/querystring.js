'use strict';

/**
 * Query strings (the part of a URL after "?") to objects and back.
 *
 *   parseQuery('?q=hello+world&tag=a&tag=b')  // { q: 'hello world', tag: ['a', 'b'] }
 *   stringifyQuery({ q: 'hello world' })       // 'q=hello+world'
 *
 * Encoding follows application/x-www-form-urlencoded: a space is written as "+", and a
 * literal "+" as "%2B".
 */

function decodeComponent(text) {
  return decodeURIComponent(text);
}

function encodeComponent(text) {
  return encodeURIComponent(String(text)).replace(/%20/g, '+');
}

function parseQuery(query) {
  const result = {};
  const text = query.startsWith('?') ? query.slice(1) : query;
  for (const part of text.split('&')) {
    if (part === '') continue;
    const eq = part.indexOf('=');
    const key = decodeComponent(eq === -1 ? part : part.slice(0, eq));
    const value = eq === -1 ? '' : decodeComponent(part.slice(eq + 1));
    if (Object.prototype.hasOwnProperty.call(result, key)) {
      // A repeated key collects its values in order.
      result[key] = [].concat(result[key], value);
    } else {
      result[key] = value;
    }
  }
  return result;
}

function stringifyQuery(params) {
  const parts = [];
  for (const [key, value] of Object.entries(params)) {
    for (const item of Array.isArray(value) ? value : [value]) {
      parts.push(`${encodeComponent(key)}=${encodeComponent(item)}`);
    }
  }
  return parts.join('&');
}

module.exports = { parseQuery, stringifyQuery };
