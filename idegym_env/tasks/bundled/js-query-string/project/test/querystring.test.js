'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { parseQuery, stringifyQuery } = require('../src/querystring');

test('parses simple pairs', () => {
  assert.deepEqual(parseQuery('a=1&b=two'), { a: '1', b: 'two' });
});

test('ignores a leading question mark', () => {
  assert.deepEqual(parseQuery('?page=3'), { page: '3' });
});

test('empty query gives an empty object', () => {
  assert.deepEqual(parseQuery(''), {});
  assert.deepEqual(parseQuery('?'), {});
});

test('repeated keys collect into an array', () => {
  assert.deepEqual(parseQuery('tag=a&tag=b&tag=c'), { tag: ['a', 'b', 'c'] });
});

test('a key without "=" has an empty value', () => {
  assert.deepEqual(parseQuery('debug&x=1'), { debug: '', x: '1' });
});

test('decodes percent escapes', () => {
  assert.deepEqual(parseQuery('name=Ren%C3%A9e&path=%2Fhome%2Fme'), { name: 'Renée', path: '/home/me' });
});

test('plus means space', () => {
  assert.deepEqual(parseQuery('q=hello+world'), { q: 'hello world' });
});

test('plus in keys means space too', () => {
  assert.deepEqual(parseQuery('first+name=Ada'), { 'first name': 'Ada' });
});

test('an encoded plus stays a plus', () => {
  assert.deepEqual(parseQuery('expr=1%2B1+%3D+2'), { expr: '1+1 = 2' });
});

test('stringify then parse is the identity', () => {
  const params = { q: 'red shoes + socks', tag: ['a b', 'c'], empty: '' };
  assert.equal(stringifyQuery(params), 'q=red+shoes+%2B+socks&tag=a+b&tag=c&empty=');
  assert.deepEqual(parseQuery(stringifyQuery(params)), params);
});
