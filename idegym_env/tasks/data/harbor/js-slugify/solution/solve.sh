#!/bin/bash
set -e
cat > /app/slugify.js <<'JS'
'use strict';

const SPECIAL = { 'ß': 'ss', 'æ': 'ae', 'Æ': 'AE', 'ø': 'o', 'Ø': 'O', 'đ': 'd', 'Đ': 'D' };

function slugify(title, options = {}) {
  let s = String(title).replace(/[ßæÆøØđĐ]/g, (c) => SPECIAL[c]);
  s = s.normalize('NFKD').replace(/[\u0300-\u036f]/g, '');
  s = s.toLowerCase().replace(/['’]/g, '').replace(/[^a-z0-9]+/g, '-').replace(/^-+|-+$/g, '');
  const max = options.maxLength;
  if (max !== undefined && s.length > max) {
    const cut = s.slice(0, max);
    if (s[max] === '-') {
      s = cut;
    } else {
      const dash = cut.lastIndexOf('-');
      s = dash > 0 ? cut.slice(0, dash) : cut;
    }
    s = s.replace(/-+$/, '');
  }
  return s;
}

module.exports = { slugify };
JS
