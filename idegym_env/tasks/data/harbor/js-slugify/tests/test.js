'use strict';
// Each case is one check; the reward is the fraction that pass (written to reward.json).
const fs = require('fs');
const cases = [
  [['Crème Brûlée: A Love Story'], 'creme-brulee-a-love-story'],
  [['Hello, World!'], 'hello-world'],
  [['  --Leading and trailing--  '], 'leading-and-trailing'],
  [["Don't Stop Believin’"], 'dont-stop-believin'],
  [['Straße & Smørrebrød'], 'strasse-smorrebrod'],
  [['Ærø Đakovo'], 'aero-dakovo'],
  [['C++ & C# in 2024'], 'c-c-in-2024'],
  [['ÖL'], 'ol'],
  [['!!!'], ''],
  [['a'.repeat(5)], 'aaaaa'],
  [['The quick brown fox', { maxLength: 12 }], 'the-quick'],
  [['The quick brown fox', { maxLength: 9 }], 'the-quick'],
  [['Supercalifragilistic', { maxLength: 5 }], 'super'],
  [['one two', { maxLength: 100 }], 'one-two'],
];
let passed = 0;
let slugify;
try {
  ({ slugify } = require('/app/slugify.js'));
} catch (err) {
  console.log('cannot load /app/slugify.js:', err.message);
}
for (const [args, expected] of cases) {
  let got;
  try {
    got = slugify(...args);
  } catch (err) {
    got = `<threw ${err.message}>`;
  }
  const ok = got === expected;
  passed += ok ? 1 : 0;
  console.log(`${ok ? 'PASS' : 'FAIL'} slugify(${JSON.stringify(args)}) = ${JSON.stringify(got)}` +
              (ok ? '' : ` expected ${JSON.stringify(expected)}`));
}
fs.mkdirSync('/logs/verifier', { recursive: true });
fs.writeFileSync('/logs/verifier/reward.json',
                 JSON.stringify({ reward: passed / cases.length, passed, total: cases.length }) + '\n');
console.log(`${passed} passed, ${cases.length - passed} failed`);
