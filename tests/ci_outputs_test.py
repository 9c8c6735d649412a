#!/usr/bin/env python3
"""JUnit XML and Markdown from real runs of `pipecheck run` and `pipecheck compare`.

tests/data/ci.csv holds one scenario per outcome: passes (pass), misses (a fault with
expect=pass: failure), crashes (a rank aborts: error), caught (a fault with expect=fail, met:
pass). The JUnit file must parse, hold one testcase per scenario with its outcome, message and
properties, and counts on <testsuites> and <testsuite> equal to its cases'. The Markdown must
list the failures first, then a table row per scenario; where python3-markdown is installed it
must render as an HTML table (the check a CI page does). compare's JUnit has a failure per
regression, and --markdown appends when the file is $GITHUB_STEP_SUMMARY.
Usage: ci_outputs_test.py PIPECHECK SOURCE_DIR WORKDIR
"""
import csv
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

pipecheck, source, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def run(*args, env=None):
    result = subprocess.run([pipecheck, *args], capture_output=True, text=True, env=env)
    return result.returncode, result.stdout + result.stderr


def junit_cases(path, expected_tests):
    root = ElementTree.parse(path).getroot()
    check(root.tag == "testsuites", f"{path}: root is <testsuites>")
    suites = root.findall("testsuite")
    check(len(suites) == 1, f"{path}: one <testsuite>")
    suite = suites[0]
    cases = suite.findall("testcase")
    counts = {
        "tests": len(cases),
        "failures": sum(1 for c in cases if c.find("failure") is not None),
        "errors": sum(1 for c in cases if c.find("error") is not None),
        "skipped": sum(1 for c in cases if c.find("skipped") is not None),
    }
    check(counts["tests"] == expected_tests, f"{path}: {counts['tests']} testcases, expected {expected_tests}")
    for element in (root, suite):
        for name, value in counts.items():
            check(element.get(name) == str(value), f"{path}: <{element.tag}> {name}={element.get(name)}, cases say {value}")
        check(float(element.get("time")) >= 0, f"{path}: <{element.tag}> has a time")
    for case in cases:
        check(case.get("classname") and case.get("name"), f"{path}: a testcase without classname or name")
        check(float(case.get("time")) >= 0, f"{path}: {case.get('name')}: time")
        outcomes = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        check(len(outcomes) <= 1, f"{path}: {case.get('name')}: several outcomes {outcomes}")
    check(suite.get("timestamp") and suite.get("hostname"), f"{path}: timestamp and hostname")
    return {case.get("name"): case for case in cases}


def properties(case):
    return {p.get("name"): p.get("value") for p in case.iter("property")}


# 1. pipecheck run --junit --markdown over one scenario per outcome.
suite = source / "tests/data/ci.csv"
out = work / "run"
code, output = run("run", "--scenarios", str(suite), "--out", str(out), "--junit", str(out / "junit.xml"),
                   "--markdown", str(out / "summary.md"))
check(code == 1, f"run: exit {code} (two scenarios miss their expectation)\n{output}")
cases = junit_cases(out / "junit.xml", 4)
check(set(cases) == {"passes", "misses", "crashes", "caught"}, f"run junit: cases {sorted(cases)}")
if set(cases) == {"passes", "misses", "crashes", "caught"}:
    for name in ("passes", "caught"):
        check(len([c for c in cases[name] if c.tag in ("failure", "error", "skipped")]) == 0, f"{name}: a pass")
    failure = cases["misses"].find("failure")
    check(failure is not None and failure.get("type") == "FAIL" and failure.get("message").startswith(
        "expected pass, got FAIL: "), f"misses: <failure type=FAIL> with the message: {ElementTree.tostring(cases['misses'])}")
    error = cases["crashes"].find("error")
    check(error is not None and error.get("type") == "ERROR" and "rank 1 was killed by signal 6" in error.get("message"),
          f"crashes: <error type=ERROR> naming the rank: {ElementTree.tostring(cases['crashes'])}")
    for name, case in cases.items():
        check(case.get("classname") == str(suite), f"{name}: classname is the suite file")
        check(float(case.get("time")) > 0, f"{name}: its wall time")
        props = properties(case)
        check(props.get("status") and props.get("expect") == ("fail" if name == "caught" else "pass"),
              f"{name}: status and expect properties: {props}")
    passes = properties(cases["passes"])
    for key in ("transport", "loss_max_abs_diff", "grad_max_rel_err", "worst_param", "pp_tokens_per_s",
                "pp_peak_bytes_max"):
        check(key in passes, f"passes: property {key}: {passes}")

markdown = (out / "summary.md").read_text()
lines = markdown.splitlines()
check(lines[0].startswith("### ❌ pipecheck run") and "2 of 4 scenarios met their expectation" in lines[0],
      f"markdown headline: {lines[0]}")
table_start = next((i for i, l in enumerate(lines) if l.startswith("| | scenario |")), len(lines))
bullets = [i for i, l in enumerate(lines) if l.startswith("- ❌ ")]
check([lines[i].split("**")[1] for i in bullets] == ["misses", "crashes"], f"markdown: failures listed: {bullets}")
check(all(i < table_start for i in bullets), "markdown: the failures come before the table")
rows = [l for l in lines[table_start + 2:] if l.startswith("| ")]
check([r.split(" | ")[1] for r in rows] == ["passes", "misses", "crashes", "caught"], f"markdown rows: {rows}")

try:
    import markdown as markdown_module
except ImportError:
    markdown_module = None
    print("note: python3-markdown missing; the Markdown was checked as text only")
if markdown_module:
    html = markdown_module.markdown(markdown, extensions=["tables"])
    check(html.count("<table>") == 1 and html.count("<tr>") == 5, f"markdown renders one table of 4 rows:\n{html}")
    check(html.index("<ul>") < html.index("<table>"), "rendered: the failure list comes before the table")
    (work / "summary.html").write_text(html)

# 2. compare --junit --markdown: against itself (no regression), then against a faster baseline.
code, output = run("compare", str(out), str(out), "--junit", str(work / "same.xml"))
check(code == 0, f"compare with itself: exit {code}\n{output}")
same = junit_cases(work / "same.xml", 4)
check(all(c.find("failure") is None for c in same.values()), "compare with itself: no failure")
faster = work / "faster"
faster.mkdir()
with open(out / "summary.csv") as f:
    rows = list(csv.DictReader(f))
for row in rows:
    if row["scenario"] == "passes":
        row["pp_tokens_per_s"] = str(float(row["pp_tokens_per_s"]) * 2)  # the current run is half as fast
        # A baseline gates tokens/s only with a measure of its noise: as if three runs were merged.
        row["pp_tokens_per_s_spread"], row["pp_tokens_per_s_runs"] = "0.05", "3"
with open(faster / "summary.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
step_summary = work / "step_summary.md"
step_summary.write_text("earlier step\n")
env = dict(os.environ, GITHUB_STEP_SUMMARY=str(step_summary))
code, output = run("compare", str(faster), str(out), "--junit", str(work / "slower.xml"), "--markdown",
                   str(step_summary), env=env)
check(code == 1, f"compare with a faster baseline: exit {code}\n{output}")
slower = junit_cases(work / "slower.xml", 4)
regression = slower.get("passes").find("failure") if "passes" in slower else None
check(regression is not None and regression.get("type") == "regression" and "tokens/s -50.0%" in regression.get("message"),
      f"compare: the slowdown is a failure: {ElementTree.tostring(slower['passes']) if 'passes' in slower else None}")
check(sum(1 for c in slower.values() if c.find("failure") is not None) == 1, "compare: only that one fails")
text = step_summary.read_text()
check(text.startswith("earlier step\n") and "### ❌ pipecheck compare" in text and "▼ -50.0%" in text,
      f"$GITHUB_STEP_SUMMARY appended to, with ▼ and the percentage:\n{text}")
other = work / "other.md"
other.write_text("old contents\n")
run("compare", str(faster), str(out), "--markdown", str(other), env=env)
check(not other.read_text().startswith("old contents"), "--markdown FILE other than $GITHUB_STEP_SUMMARY is replaced")

for failure in failures:
    print("FAIL:", failure)
print(f"{len(failures)} problem(s)")
sys.exit(1 if failures else 0)
