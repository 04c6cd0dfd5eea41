#!/usr/bin/env bash
# Every link and file name a reader of KAT's documentation follows must resolve inside the
# repository: relative Markdown links (anchors stripped) in README.md, CHANGELOG.md, docs/ and examples/,
# and the repository paths they name in backticks (scripts/…, docs/…, include/kat/…, tests/…,
# examples/…, bench/…, cmake/…). Headers' comments are checked for the docs/ pages they cite.
# Prints every broken reference and exits 1 if there is one. Run by ctest (docs_resolve).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bad=0
report() { # report FILE WHAT
  echo "check_docs.sh: $1: $2 does not resolve inside the repository" >&2
  bad=1
}
exists() { # exists PATH (a file or directory; a trailing glob such as test_*.cpp may match)
  compgen -G "$1" >/dev/null
}

mapfile -t pages < <(ls README.md CHANGELOG.md docs/*.md examples/*/README.md 2>/dev/null)
for page in "${pages[@]}"; do
  dir=$(dirname "$page")
  prose=$(awk '/^[[:space:]]*```/ { code = !code; next } !code' "$page") # no code blocks
  # [text](target): relative targets only.
  while IFS= read -r target; do
    target=${target%%#*}
    [ -n "$target" ] || continue
    case $target in http://* | https://* | mailto:*) continue ;; esac
    exists "$dir/$target" || report "$page" "link ($target)"
  done < <(grep -o '\](\([^)]*\))' <<<"$prose" | sed -E 's/^\]\((.*)\)$/\1/')
  # `path` naming a file of the repository.
  while IFS= read -r path; do
    path=${path%%:*} # file:line
    exists "$path" || report "$page" "\`$path\`"
  done < <(grep -oE '`(scripts|docs|include/kat|tests|examples|bench|cmake)/[^` ]*`' <<<"$prose" |
    tr -d '`' | sed -E 's/[.,;)]+$//')
done

# docs/ pages cited from headers, tests and examples.
while IFS= read -r hit; do
  file=${hit%%:*}
  page=${hit#*:}
  exists "$page" || report "$file" "$page"
done < <(grep -roE 'docs/[a-z_]+\.md' include tests examples bench | sort -u)

if [ "$bad" -ne 0 ]; then
  exit 1
fi
echo "check_docs.sh: every link and repository path in the documentation resolves"
