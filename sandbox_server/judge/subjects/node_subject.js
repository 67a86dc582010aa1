// The subject side of the judge for JavaScript: requires the code under test and answers calls.
// Run as `node node_subject.js` in the project directory by the grader (as the tool user);
// requests on stdin, answers on the descriptor named by IDEGYM_ANSWER_FD, one JSON document a
// line (see ../protocol.py). Values: JSON's own; objects and functions stay here as refs.
'use strict';

const fs = require('fs');
const path = require('path');
const readline = require('readline');

const TAG = '$t';
const answerFd = Number(process.env.IDEGYM_ANSWER_FD || 3);
delete process.env.IDEGYM_ANSWER_FD;
const objects = new Map();
let nextId = 1;

function isClass(f) {
  return typeof f === 'function' && /^class[\s{]/.test(Function.prototype.toString.call(f));
}

function ref(obj) {
  const id = nextId++;
  objects.set(id, obj);
  const type = (obj && obj.constructor && obj.constructor.name) || typeof obj;
  let repr;
  try { repr = String(obj).slice(0, 200); } catch (e) { repr = `<${type}>`; }
  return { [TAG]: 'ref', id, type, callable: typeof obj === 'function', repr };
}

function encode(value, depth = 0) {
  if (depth > 64) throw new TypeError('value nested more than 64 levels deep');
  if (value === null || value === undefined) return null;
  switch (typeof value) {
    case 'boolean': case 'string': return value;
    case 'number':
      if (Number.isFinite(value)) return value;
      return { [TAG]: 'float', v: Number.isNaN(value) ? 'nan' : (value > 0 ? 'inf' : '-inf') };
    case 'bigint': return { [TAG]: 'int', v: value.toString() };
    default: break;
  }
  if (Array.isArray(value)) return value.map((v) => encode(v, depth + 1));
  const proto = Object.getPrototypeOf(value);
  if (proto === Object.prototype || proto === null) {
    return { [TAG]: 'dict', v: Object.keys(value).map((k) => [k, encode(value[k], depth + 1)]) };
  }
  if (Buffer.isBuffer(value)) return { [TAG]: 'bytes', v: value.toString('base64') };
  return ref(value);
}

function decode(doc, depth = 0) {
  if (depth > 64) throw new TypeError('document nested too deeply');
  if (doc === null || typeof doc !== 'object') return doc;
  if (Array.isArray(doc)) return doc.map((v) => decode(v, depth + 1));
  const tag = doc[TAG];
  if (tag === 'dict') {
    const out = {};
    for (const [k, v] of doc.v) out[String(decode(k, depth + 1))] = decode(v, depth + 1);
    return out;
  }
  if (tag === 'tuple' || tag === 'set' || tag === 'frozenset') return doc.v.map((v) => decode(v, depth + 1));
  if (tag === 'int') return Number(doc.v);
  if (tag === 'float') return Number(doc.v.replace('inf', 'Infinity'));
  if (tag === 'bytes') return Buffer.from(doc.v, 'base64');
  if (tag === 'ref') {
    if (!objects.has(doc.id)) throw new Error(`unknown object reference ${doc.id}`);
    return objects.get(doc.id);
  }
  throw new TypeError(`unknown value tag ${tag}`);
}

function exception(err) {
  const chain = [];
  let proto = err !== null && typeof err === 'object' ? Object.getPrototypeOf(err) : null;
  while (proto && proto.constructor && proto.constructor !== Object) {
    chain.push(`js.${proto.constructor.name}`);
    proto = Object.getPrototypeOf(proto);
  }
  const builtin = { TypeError: 'TypeError', RangeError: 'ValueError', SyntaxError: 'SyntaxError' }[
    err && err.constructor && err.constructor.name] || null;
  return {
    [TAG]: 'exc', type: chain[0] || 'js.Error', chain, builtin,
    message: String(err && err.message !== undefined ? err.message : err).slice(0, 4000),
    traceback: String((err && err.stack) || '').slice(-4000),
  };
}

function invoke(fn, self, args) {
  if (isClass(fn)) return new fn(...args);
  return fn.apply(self, args);
}

function handle(req) {
  const args = (req.args || []).map((a) => decode(a));
  switch (req.op) {
    case 'release': for (const id of req.ids || []) objects.delete(id); return null;
    default: break;
  }
  const target = decode(req.ref || {});
  switch (req.op) {
    case 'getattr': return target[req.name];
    case 'setattr': target[req.name] = decode(req.value); return null;
    case 'call': return invoke(target, undefined, args);
    case 'callmethod': return invoke(target[req.name], target, args);
    default: throw new TypeError(`unknown request op ${req.op}`);
  }
}

function answer(doc) {
  fs.writeSync(answerFd, JSON.stringify(doc) + '\n');
}

const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
lines.on('line', (line) => {
  let doc;
  try {
    const req = JSON.parse(line);
    // A module is always a handle, even when it exports a plain object.
    doc = { ok: req.op === 'import' ? ref(require(path.resolve(process.cwd(), String(req.name)))) : encode(handle(req)) };
  } catch (err) {
    doc = { err: exception(err) };
  }
  answer(doc);
});
lines.on('close', () => process.exit(0));
