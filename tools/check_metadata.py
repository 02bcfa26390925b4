"""What PyPI and crates.io will show agrees, and nothing a release needs is missing.

    python tools/check_metadata.py --wheel dist/*.whl --pythons 3.11 3.12 3.13

Checks, naming each failure:

- every workspace crate has the workspace's one version; the crates published to crates.io
  (``dlpack-core``, ``dlpack-adapter``) have a description, license, repository, homepage,
  documentation, readme (a file in the crate), keywords and categories, and the adapter asks for
  the core's version;
- ``pyproject.toml`` has the same license and repository, every project URL, a readme, keywords,
  and one "Python :: 3.X" classifier for each version of ``--pythons`` (those CI runs the suite
  on), none other, the first of them being ``requires-python``'s lower bound;
- each wheel named: its metadata says the crates' version, the license, those classifiers and
  URLs, and its file name is abi3 and manylinux2014.

Exits 1 after listing what is wrong.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ("dlpack-core", "dlpack-adapter")
CRATE_FIELDS = (
    "description",
    "license",
    "repository",
    "homepage",
    "documentation",
    "readme",
    "keywords",
    "categories",
)
PROJECT_URLS = ("Homepage", "Documentation", "Repository", "Issues", "Changelog")


def crates() -> dict[str, dict]:
    done = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return {p["name"]: p for p in json.loads(done.stdout)["packages"]}


def check_crates(packages: dict[str, dict], problems: list[str]) -> dict:
    root = packages["dlpack-runtime"]
    for name in ("dlpack-runtime", *PUBLISHED):
        package = packages[name]
        if package["version"] != root["version"]:
            problems.append(f"{name} is version {package['version']}, not {root['version']}")
    for name in PUBLISHED:
        package = packages[name]
        for field in CRATE_FIELDS:
            if not package.get(field):
                problems.append(f"{name}'s Cargo.toml has no {field}")
        readme = package.get("readme")
        if readme and not (Path(package["manifest_path"]).parent / readme).is_file():
            problems.append(f"{name}'s readme {readme} is not a file in the crate")
        if package.get("repository") != root.get("repository"):
            problems.append(f"{name}'s repository differs from the workspace's")
    core = [d for d in packages["dlpack-adapter"]["dependencies"] if d["name"] == "dlpack-core"]
    if [d["req"] for d in core] != [f"^{root['version']}"]:
        problems.append(f"dlpack-adapter asks for dlpack-core {core[0]['req'] if core else None}")
    return root


def classifier_versions(classifiers: list[str]) -> list[str]:
    found = []
    for classifier in classifiers:
        m = re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", classifier)
        if m:
            found.append(m.group(1))
    return found


def check_pyproject(root: dict, pythons: list[str], problems: list[str]) -> dict:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    if project.get("license") != root["license"]:
        problems.append(f"pyproject.toml's license {project.get('license')!r} is not the crates'")
    urls = project.get("urls", {})
    for key in PROJECT_URLS:
        if not urls.get(key):
            problems.append(f"pyproject.toml has no {key} URL")
    if urls.get("Repository") != root["repository"]:
        problems.append("pyproject.toml's Repository URL is not the crates' repository")
    for field in ("readme", "keywords", "description"):
        if not project.get(field):
            problems.append(f"pyproject.toml has no {field}")
    declared = classifier_versions(project.get("classifiers", []))
    if sorted(declared) != sorted(pythons):
        problems.append(
            f"pyproject.toml's classifiers name Python {declared}, but the suite runs on {pythons}"
        )
    bound = project.get("requires-python")
    if bound != f">={pythons[0]}":
        problems.append(f"requires-python is {bound!r}, not >={pythons[0]}")
    return project


def check_wheel(path: str, root: dict, project: dict, problems: list[str]) -> None:
    name = Path(path).name
    if "-cp311-abi3-" not in name or "manylinux2014_x86_64" not in name:
        problems.append(f"{name}: not an abi3 manylinux2014 wheel")
    with zipfile.ZipFile(path) as wheel:
        [metadata_name] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(wheel.read(metadata_name).decode())
    if metadata["Version"] != root["version"]:
        problems.append(f"{name}: version {metadata['Version']}, not {root['version']}")
    if metadata["License-Expression"] != root["license"]:
        problems.append(f"{name}: License-Expression {metadata['License-Expression']!r}")
    if sorted(metadata.get_all("Classifier") or []) != sorted(project["classifiers"]):
        problems.append(f"{name}: its classifiers are not pyproject.toml's")
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL") or [])
    if urls != project["urls"]:
        problems.append(f"{name}: its project URLs are not pyproject.toml's")
    if metadata["Requires-Python"] != project["requires-python"]:
        problems.append(f"{name}: Requires-Python {metadata['Requires-Python']!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pythons", nargs="+", required=True, help="3.11 3.12 ...")
    parser.add_argument("--wheel", action="append", default=[], dest="wheels", help="a wheel")
    args = parser.parse_args()
    problems: list[str] = []
    root = check_crates(crates(), problems)
    project = check_pyproject(root, args.pythons, problems)
    for wheel in args.wheels:
        check_wheel(wheel, root, project, problems)
    for problem in problems:
        print(f"metadata: {problem}", file=sys.stderr)
    if not problems:
        print(f"metadata: version {root['version']}, crates and package agree", end="")
        print(f" ({len(args.wheels)} wheel(s) checked)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
