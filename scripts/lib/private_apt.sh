# Sourced by the setup scripts. A private apt configuration derived from the machine's own
# sources, so that the system's apt setup is never changed and no host name is written
# anywhere: the same URIs and suites, with other entry types or components.
#
#   kat_private_apt DIR TYPES [COMPONENTS]
#     DIR         a scratch directory for the sources and the package lists
#     TYPES       "deb", "deb-src" or "deb deb-src"
#     COMPONENTS  replaces each entry's components (e.g. "main contrib non-free");
#                 empty: keep them
#   Sets the array kat_apt_opts: pass it to every apt-get call that should use it.

kat_private_apt() {
  local dir=$1 types=$2 components=${3:-} f
  mkdir -p "$dir/sources.list.d" "$dir/lists/partial"
  shopt -s nullglob
  for f in /etc/apt/sources.list.d/*.sources; do
    if [ -n "$components" ]; then
      sed -E -e "s/^Types:.*$/Types: $types/" -e "s/^Components:.*$/Components: $components/" \
        "$f" >"$dir/sources.list.d/$(basename "$f")"
    else
      sed -E "s/^Types:.*$/Types: $types/" "$f" >"$dir/sources.list.d/$(basename "$f")"
    fi
  done
  # One-line format: "deb [options] URI suite component...".
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    local out=$dir/sources.list.d/$(basename "$f").list t
    : >"$out"
    for t in $types; do
      if [ -n "$components" ]; then
        sed -nE "s/^[[:space:]]*deb[[:space:]]+((\[[^]]*\][[:space:]]+)?[^[:space:]]+[[:space:]]+[^[:space:]]+).*$/$t \1 $components/p" \
          "$f" >>"$out"
      else
        sed -nE "s/^[[:space:]]*deb[[:space:]]+/$t /p" "$f" >>"$out"
      fi
    done
  done
  shopt -u nullglob
  kat_apt_opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$dir/sources.list.d"
    -o "Dir::State::Lists=$dir/lists" -o APT::Sandbox::User=root -qq)
}
