#!/usr/bin/env bash
# tools/transformers_env.sh: a second Python environment that differs from the current one only
# in its transformers release, to run the project on another release of the supported range.
#
# Usage: tools/transformers_env.sh DIR [TRANSFORMERS_VERSION [HUB_VERSION]]   [5.17.0 1.33.0]
#
# DIR becomes a venv whose own site-packages come first and the current environment's packages
# after them (a .pth file), so pip installs only what differs (transformers, the
# huggingface_hub it needs, and their missing dependencies: about 20 s and 20 MB) and reuses
# torch and everything else. Safe to run again: an environment that already has the requested
# releases is kept. Prints DIR's Python; run the project with it:
#     tools/transformers_env.sh .ci-transformers-5.17 && .ci-transformers-5.17/bin/python run_qa.py ...
# PYTHON: the interpreter of the environment to build on [python].
set -euo pipefail

die() { printf 'transformers_env.sh: error: %s\n' "$*" >&2; exit 1; }
[[ $# -ge 1 && $1 != -* ]] || { sed -n '2,/^set /{/^#/s/^# \{0,1\}//p}' "$0"; exit 2; }
dir=$(realpath -m "$1") version=${2:-5.17.0} hub=${3:-1.33.0}
base=${PYTHON:-python}
py=$dir/bin/python

versions='import transformers, huggingface_hub as h; print(transformers.__version__, h.__version__)'
have=$("$py" -c "$versions" 2>/dev/null || true)
if [[ $have == "$version $hub" ]]; then
  echo "$py"
  exit 0
fi
base_site=$("$base" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') ||
  die "$base does not run: set PYTHON to the project environment's interpreter"
[[ ! -e $dir || -x $py ]] || die "$dir exists and is not a venv: choose another folder"
"$base" -m venv --without-pip "$dir" || die "could not create a venv in $dir"
own_site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# addsitedir (not a plain path line) also runs the base's own .pth files: the project installed
# editable, setuptools' shims.
printf 'import site; site.addsitedir(%s)\n' "'$base_site'" >"$own_site/project-environment.pth"
# pip of the base environment, installing into this one; it leaves the base's own copies alone
# ("outside environment") and this venv's come first on sys.path.
"$base" -m pip --python "$py" install --quiet --disable-pip-version-check \
  "transformers==$version" "huggingface_hub==$hub" ||
  die "pip could not install transformers==$version with huggingface_hub==$hub (see above)"
have=$("$py" -c "$versions") ||
  die "transformers $version does not import in $dir (see above)"
[[ $have == "$version $hub" ]] || die "$dir has transformers and huggingface_hub $have, not $version $hub"
echo "$py"
