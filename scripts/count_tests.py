#!/usr/bin/env python3
"""Sums test cases over meson test logs: Criterion's Synthesis line where a test printed one,
otherwise the meson test itself counts as one. Prints 'N passed, N failed, N skipped'; with
--final (the end of scripts/test), the skipped count on a line of its own and then, as the very
last line, exactly 'N passed, N failed', the form CI reads."""
import json
import re
import sys

SYNTHESIS = re.compile(r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+)")
SKIP = re.compile(r"^\[SKIP\]", re.M)

passed = failed = skipped = 0
args = sys.argv[1:]
final = args[:1] == ["--final"]
if final:
    args = args[1:]
if args[:1] == ["--plus"]:  # counts of tests run outside meson: --plus PASSED,FAILED
    extra_passed, extra_failed = (int(v) for v in args[1].split(","))
    passed += extra_passed
    failed += extra_failed
    args = args[2:]
for path in args:
    with open(path) as log:
        for line in log:
            t = json.loads(line)
            text = (t.get("stdout") or "") + (t.get("stderr") or "")
            m = SYNTHESIS.search(text)
            if m:
                passed += int(m.group(2))
                failed += int(m.group(3))
                skipped += len(SKIP.findall(text))
                if t["result"] not in ("OK", "EXPECTEDFAIL") and int(m.group(3)) == 0:
                    failed += 1  # crashed or timed out after its cases passed
            elif t["result"] == "SKIP":
                skipped += 1
            elif t["result"] in ("OK", "EXPECTEDFAIL"):
                passed += 1
            else:
                failed += 1
if final:
    print(f"{skipped} skipped (backends this CPU or emulator cannot run, and quick-mode skips)")
    print(f"{passed} passed, {failed} failed")
else:
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
