#!/usr/bin/env python3
"""Fails when a test was skipped on the CPU for a reason other than needing a GPU or the network.

Reads the JUnit file `ctest --output-junit FILE` writes (scripts/test.sh passes its arguments to ctest). Each skipped
test's output holds GoogleTest's skip message; a skip is allowed only when that message says the test needs a GPU
(CUDA) or the network. Everything else a test needs on a CPU machine (tools, Python clients, Chromium) is installed by
scripts/setup.sh and scripts/test-deps.sh, so a skip for it means CI did not run the test.
"""
import re
import sys
import xml.etree.ElementTree as ET

ALLOWED = re.compile(r"CUDA|GPU|SLM_NETWORK_TESTS|network", re.IGNORECASE)


def main(path):
    root = ET.parse(path).getroot()
    skipped, bad = 0, []
    for case in root.iter("testcase"):
        if case.find("skipped") is None and case.get("status") not in ("notrun", "skipped"):
            continue
        skipped += 1
        out = "".join((e.text or "") for e in case.iter() if e.tag in ("system-out", "skipped"))
        out += " ".join(e.get("message", "") for e in case.iter("skipped"))
        reasons = [l.strip() for l in out.splitlines() if "Skipped" in l or "SKIP" in l or l.strip()]
        if not ALLOWED.search(out):
            bad.append((case.get("name"), " | ".join(reasons[-3:])[:300]))
    total = sum(1 for _ in root.iter("testcase"))
    print(f"check-skips: {total} tests, {skipped} skipped, {len(bad)} for a reason other than a GPU or the network")
    for name, why in bad:
        print(f"  {name}: {why}")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: check-skips.py CTEST_JUNIT_XML")
    sys.exit(main(sys.argv[1]))
