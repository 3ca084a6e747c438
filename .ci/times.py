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


if __name__ == "__main__":
    main(sys.argv[1])
