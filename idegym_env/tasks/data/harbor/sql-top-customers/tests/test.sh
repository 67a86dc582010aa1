#!/bin/bash
# Runs /app/query.sql on the task's database and on another one; reward = fraction right.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
work=$(mktemp -d)
cp /app/shop.db "$work/shop.db" 2>/dev/null || true
sqlite3 "$work/other.db" < /tests/other.sql
printf 'name,total\nBrendan,120.0\nDana,31.0\nAda,29.5\n' > "$work/shop.want"
printf 'name,total\nYara,30.0\nZed,30.0\nWu,9.99\n' > "$work/other.want"
pass=0; total=0
for db in shop other; do
    total=$((total + 1))
    if [ -f "$work/$db.db" ] && timeout 20 sqlite3 -csv -header "$work/$db.db" < /app/query.sql > "$work/$db.got" 2>&1 \
        && diff -u "$work/$db.want" "$work/$db.got"; then
        pass=$((pass + 1)); echo "PASS $db"
    else
        echo "FAIL $db"; cat "$work/$db.got" 2>/dev/null | head -20
    fi
done
echo "$pass passed, $((total - pass)) failed"
awk -v p="$pass" -v t="$total" 'BEGIN {printf "%.4f\n", p / t}' > /logs/verifier/reward.txt
