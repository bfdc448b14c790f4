#!/bin/sh
# Installs helm-python-sdk (Helm's own library, so no helm binary) and PyYAML from the Python
# registry under target/, once per clone, and prints the folder to put on PYTHONPATH. Used by the
# chart's tests and tools (scripts/chart.py) and the Agones scenario's render.py.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
python=$root/target/bench-tools/helm-python
mkdir -p "$root/target/bench-tools"
# Tests run in parallel: one installs, the others wait for it.
exec 9>"$root/target/bench-tools/helm-python.lock"
flock 9
if [ ! -d "$python/helm_python" ] || [ ! -d "$python/yaml" ]; then
	echo "installing helm-python-sdk and PyYAML (from the Python registry) under $python" >&2
	python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --target "$python" \
		helm-python-sdk==0.2.2 pyyaml >&2
fi
echo "$python"
