#!/bin/bash
set -e
cat > /app/report.py <<'PY'
import csv
import json
import sys
from decimal import Decimal, InvalidOperation


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "/app/inventory.csv"
    total_items, total_value, low, best, best_value = 0, Decimal(0), [], None, None
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            try:
                qty = int(row["qty"])
                price = Decimal(row["unit_price"])
            except (ValueError, InvalidOperation, TypeError, KeyError):
                continue
            value = qty * price
            total_items += qty
            total_value += value
            if qty < 5:
                low.append(row["sku"])
            if best_value is None or value > best_value:
                best, best_value = row["sku"], value
    report = {"total_items": total_items, "total_value": float(round(total_value, 2)),
              "low_stock": sorted(low), "most_valuable": best}
    with open("/app/report.json", "w") as handle:
        json.dump(report, handle)


main()
PY
