#!/usr/bin/env python3
"""The README's quick starts are files the tests run: each code block after
a `<!-- file: PATH -->` line must be PATH's content exactly. Exits 1 naming
every block that drifted (or a marker without a block), 0 otherwise.

    tests/readme-files.py [README.md]
"""

import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
readme = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root / "README.md"
text = readme.read_text()
marker = re.compile(r"^<!-- file: (\S+) -->\n```[a-z]*\n(.*?)^```$", re.M | re.S)
found = {m.group(1): m.group(2) for m in marker.finditer(text)}
bad = []
for line in re.findall(r"^<!-- file: (\S+) -->$", text, re.M):
    if line not in found:
        bad.append(f"{line}: no code block right after its marker")
        continue
    path = root / line
    if not path.is_file():
        bad.append(f"{line}: no such file")
    elif path.read_text() != found[line]:
        bad.append(f"{line}: the README's block differs from the file (copy the file into the block)")
if not found:
    bad.append("no `<!-- file: PATH -->` blocks in the README")
for b in bad:
    print(b)
if bad:
    print(f"README blocks: {len(bad)} failed")
    sys.exit(1)
print(f"test result: ok. {len(found)} passed; 0 failed (README blocks are the files the tests run: {', '.join(sorted(found))})")
