#!/usr/bin/env bash
# NVIDIA's CUDA toolkit from PyPI, for compiling and linking the `cuda`
# feature on a machine without a GPU or a system CUDA install: nvcc, the
# runtime, CCCL and cuBLAS (the `cuda-toolkit` meta-package's extras, one
# pinned release) in the venv target/cuda-venv, laid out in
# target/cuda-toolkit as CMake's FindCUDAToolkit and llamacpp-sys's link line
# expect a toolkit (bin/, include/, nvvm/, lib64/ with the unversioned
# library names the wheels lack).
#
# Prints the variables to export:  eval "$(bash scripts/cuda-toolkit.sh)"
#   CUDACXX, CUDA_PATH, CUDAToolkit_ROOT  the toolkit above
#   LLAMA_CUDA_ARCHITECTURES              as set, else 90 (the H200)
#   LLAMA_SYS_CUDA_NO_VMM=1               the wheels have no libcuda.so (the
#                                         driver's library) to link against
#   LD_LIBRARY_PATH                       its lib64/, to start the binaries
# Idempotent: reinstalls only when the pinned release changes.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/target/cuda-venv"
kit="$root/target/cuda-toolkit"
release="13.0.2"
# nvcc's wheel asks for any nvidia-nvvm (cicc), and the newest writes PTX
# this release's ptxas refuses ("Unsupported .version"): pinned with it.
spec=("cuda-toolkit[nvcc,cudart,cccl,crt,cublas]==$release" "nvidia-nvvm==13.0.88")

if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv" >&2
fi
if [[ ! -f "$venv/.release" || $(cat "$venv/.release") != "${spec[*]}" ]]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${spec[@]}" >&2
  echo "${spec[*]}" >"$venv/.release"
fi
cu="$("$venv/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')"
[[ -x "$cu/bin/nvcc" ]] || { echo "error: ${spec[*]} installed no $cu/bin/nvcc" >&2; exit 1; }

rm -rf "$kit"
mkdir -p "$kit/bin" "$kit/lib64"
for d in include nvvm; do ln -s "$cu/$d" "$kit/$d"; done
# bin/ is a folder of links, not a link: nvcc finds the toolkit as
# `<its folder>/..` (nvcc.profile), which must be this layout.
for f in "$cu"/bin/*; do ln -s "$f" "$kit/bin/"; done
for lib in "$cu"/lib/*; do
  name="$(basename "$lib")"
  ln -s "$lib" "$kit/lib64/$name"
  # libcudart.so.13 -> libcudart.so as well (the linker's -lcudart).
  if [[ $name =~ ^(lib[A-Za-z]+)\.so\.[0-9]+$ ]]; then
    ln -sf "$lib" "$kit/lib64/${BASH_REMATCH[1]}.so"
  fi
done

echo "export CUDACXX='$kit/bin/nvcc'"
echo "export CUDA_PATH='$kit'"
echo "export CUDAToolkit_ROOT='$kit'"
echo "export LLAMA_CUDA_ARCHITECTURES='${LLAMA_CUDA_ARCHITECTURES:-90}'"
echo "export LLAMA_SYS_CUDA_NO_VMM=1"
echo "export LD_LIBRARY_PATH='$kit/lib64'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
