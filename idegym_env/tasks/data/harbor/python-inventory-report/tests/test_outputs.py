"""Runs /app/report.py on several inventories; the reward is the fraction of checks passed."""
import json
import os
import subprocess
import sys
import tempfile

CASES = [
    ("/app/inventory.csv", None,
     {"total_items": 175, "total_value": 38.45, "low_stock": ["A-101", "C-300"], "most_valuable": "A-100"}),
    (None, "sku,name,qty,unit_price\nX-1,\"Gear, small\",4,2.5\nX-2,Gear,1,10\nX-3,Chain,oops,1\nX-0,Belt,7,0.5\n",
     {"total_items": 12, "total_value": 23.5, "low_stock": ["X-1", "X-2"], "most_valuable": "X-1"}),
    (None, "sku,name,qty,unit_price\nZ-9,Pin,100,0.011\nZ-8,Cap,5,0.2\n",
     {"total_items": 105, "total_value": 2.1, "low_stock": [], "most_valuable": "Z-9"}),
]


def run(path):
    report = os.environ.get("REPORT_PATH", "/app/report.json")
    if os.path.exists(report):
        os.remove(report)
    proc = subprocess.run([sys.executable, "/app/report.py", path], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        return None
    with open(report) as handle:
        return json.load(handle)


def main():
    passed = total = 0
    for path, content, expected in CASES:
        if path is None:
            handle = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
            handle.write(content)
            handle.close()
            path = handle.name
        try:
            got = run(path)
        except Exception as exc:  # noqa: BLE001 - any failure fails the case
            print("error:", exc)
            got = None
        for key, value in expected.items():
            total += 1
            ok = got is not None and (abs(got.get(key, 1e18) - value) < 0.005 if isinstance(value, float)
                                      else got.get(key) == value)
            passed += ok
            print(("PASS" if ok else "FAIL"), path, key, "expected", value, "got", None if got is None else got.get(key))
    os.makedirs("/logs/verifier", exist_ok=True)
    with open("/logs/verifier/reward.txt", "w") as handle:
        handle.write("%.4f\n" % (passed / total))
    print("%d passed, %d failed" % (passed, total - passed))


if __name__ == "__main__":
    main()
