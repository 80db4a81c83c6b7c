# Shared by scripts/up and scripts/test: make .venv with Python 3.11+ and install corral into it.
# Re-installs only when pyproject.toml changed since the last install.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-}"
python="${PYTHON:-}"
if [ -z "$python" ]; then
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      python="$candidate"
      break
    fi
  done
fi
if [ -z "$python" ]; then
  echo "corral needs Python 3.11 or newer: none found on PATH (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
  echo "creating $venv with $python" >&2
  "$python" -m venv "$venv"
fi
stamp="$venv/.corral-install"
want="$( (cat "$root/pyproject.toml"; echo "$extras") | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "installing corral${extras:+[$extras]} into $venv" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$root${extras:+[$extras]}" >&2
  echo "$want" > "$stamp"
fi
