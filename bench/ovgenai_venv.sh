#!/bin/sh
# A scratch venv with OpenVINO GenAI for the bench's backends section (docs/benchmarks-openvino-genai.md):
#
#     sh bench/ovgenai_venv.sh DIR [PROJECT_PYTHON]
#     export SPECDEC_OVGENAI_PYTHON=DIR/bin/python
#
# It installs openvino-genai at the project's OpenVINO version, and optimum-intel (which exports the
# model to the IR GenAI runs) without its dependencies; torch and transformers come from the project's
# venv (PROJECT_PYTHON, default: python3 on PATH), whose site-packages are appended to this venv's
# path, after its own. The project's own venv is not changed.
set -eu
dir=${1:?usage: sh bench/ovgenai_venv.sh DIR [PROJECT_PYTHON]}
proj=${2:-python3}
ov=$("$proj" -c "import openvino; print(openvino.__version__.split('-')[0])")
site=$("$proj" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
"$proj" -c "import torch, transformers" || { echo "$proj has no torch/transformers (pip install -e '.[test]')" >&2; exit 2; }
base=$("$proj" -c "import sys; print(sys._base_executable)")
"$base" -m venv "$dir"
"$dir/bin/pip" install -q "openvino-genai==$ov.0" "openvino==$ov"
"$dir/bin/pip" install -q --no-deps "optimum-intel==2.2.0" "optimum~=2.3.0"
own=$("$dir/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$site" > "$own/zz_specdec_project.pth"
"$dir/bin/python" -c "import openvino_genai, optimum.intel, torch; print('openvino-genai', openvino_genai.__version__)"
echo "export SPECDEC_OVGENAI_PYTHON=$dir/bin/python"
