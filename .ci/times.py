"""Seconds spent per test directory, from pytest's JUnit XML (setup, call and teardown together)."""

import sys
import xml.etree.ElementTree as ET


def main(path: str) -> None:
    per: dict[str, float] = {}
    for case in ET.parse(path).getroot().iter("testcase"):  # noqa: S314 - our own pytest run's file
        parts = case.get("classname", "").split(".")
        where = "/".join(parts[:2]) if len(parts) > 2 else parts[0]
        per[where] = per.get(where, 0.0) + float(case.get("time") or 0.0)
    total = sum(per.values())
    for where, secs in sorted(per.items(), key=lambda kv: -kv[1])[:15]:
        print(f"{secs:8.1f} s  {100 * secs / total:5.1f} %  {where}")
    print(f"{total:8.1f} s  total")


def outcomes(path: str) -> str:
    """One line counting a run's tests by outcome: passed, failed, error, skipped, xfailed."""
    counts = dict.fromkeys(("passed", "failed", "error", "skipped", "xfailed"), 0)
    for case in ET.parse(path).getroot().iter("testcase"):  # noqa: S314 - our own pytest run's file
        kinds = [child.tag for child in case]
        skipped = case.find("skipped")
        if "failure" in kinds:
            counts["failed"] += 1
        elif "error" in kinds:
            counts["error"] += 1
        elif skipped is not None:
            counts["xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"] += 1
        else:
            counts["passed"] += 1
    return ", ".join(f"{n} {kind}" for kind, n in counts.items() if n or kind == "passed")


if __name__ == "__main__":
    if sys.argv[1] == "--outcomes":
        print(outcomes(sys.argv[2]))
    else:
        main(sys.argv[1])
