//! Before CMake configures a GPU backend: is its toolchain there? CMake's
//! own errors, minutes into a build, name a missing package in its terms;
//! these say what to install, at once. The text checks are pure
//! (`src/gpu_tests.rs` includes this file); `check` does the I/O.

use std::path::{Path, PathBuf};

/// ggml's Vulkan backend uses `VK_EXT_layer_settings`, whose C++ types
/// (`vk::LayerSettingEXT`) came with headers 1.3.272.
pub const MIN_VULKAN_HEADERS: (u32, u32, u32) = (1, 3, 272);

const INSTALL_VULKAN: &str = "Install the Vulkan headers and loader and glslc: the LunarG Vulkan SDK \
    (then set VULKAN_SDK to it), or Debian 13 / Ubuntu 24.04 `apt install libvulkan-dev glslc` \
    (add mesa-vulkan-drivers for a software device). On Debian 12, whose headers are 1.3.239, \
    unpack Debian 13's libvulkan-dev headers into a folder with an include/ and set VULKAN_SDK to it \
    (this repository's scripts/vulkan-sdk.sh does)";

const INSTALL_CUDA: &str = "Install NVIDIA's CUDA toolkit (nvcc, cudart, cuBLAS) and put nvcc on PATH, \
    or set CUDACXX to nvcc and CUDA_PATH to the toolkit; without a system install, this repository's \
    scripts/cuda-toolkit.sh installs NVIDIA's PyPI packages into a venv and prints the variables to set";

/// The headers' version from `vulkan_core.h`'s text: the patch level of
/// `VK_HEADER_VERSION` and the major and minor of
/// `VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, major, minor, …)`.
pub fn vulkan_header_version(vulkan_core_h: &str) -> Option<(u32, u32, u32)> {
    let define = |name: &str| {
        vulkan_core_h.lines().find_map(|l| l.trim().strip_prefix("#define ")?.trim().strip_prefix(name).map(str::trim))
    };
    let patch = define("VK_HEADER_VERSION ")?.parse().ok()?;
    let complete = define("VK_HEADER_VERSION_COMPLETE ")?;
    let args = complete.split_once('(')?.1.split_once(')')?.0;
    let parts: Vec<&str> = args.split(',').map(str::trim).collect();
    match parts.as_slice() {
        [_, major, minor, _] => Some((major.parse().ok()?, minor.parse().ok()?, patch)),
        _ => None,
    }
}

/// Why the headers at `path` (text `vulkan_core_h`) cannot build ggml's
/// Vulkan backend, if they cannot.
pub fn vulkan_headers_problem(path: &Path, vulkan_core_h: &str) -> Option<String> {
    let (a, b, c) = MIN_VULKAN_HEADERS;
    match vulkan_header_version(vulkan_core_h) {
        Some(v) if v >= MIN_VULKAN_HEADERS => None,
        Some((x, y, z)) => Some(format!(
            "the `vulkan` feature needs Vulkan headers {a}.{b}.{c} or newer; {} has {x}.{y}.{z}. {INSTALL_VULKAN}",
            path.display()
        )),
        None => Some(format!("cannot read the Vulkan headers' version in {}. {INSTALL_VULKAN}", path.display())),
    }
}

/// The first `name` in `dirs`, then on `path` (PATH's value).
fn find_program(name: &str, dirs: &[PathBuf], path: Option<&str>) -> Option<PathBuf> {
    let on_path = path.map(|p| std::env::split_paths(p).collect::<Vec<_>>()).unwrap_or_default();
    dirs.iter().chain(&on_path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Stops the build with what to install when a GPU feature's toolchain is
/// missing. `var` reads an environment variable (build/env.rs).
pub fn check(vulkan: bool, cuda: bool, os: &str, var: impl Fn(&str) -> Option<String>) -> Result<(), String> {
    // Other systems find their SDKs their own ways (Windows: VULKAN_SDK,
    // CUDA_PATH); CMake's errors stand there.
    if os != "linux" {
        return Ok(());
    }
    let path = std::env::var("PATH").ok();
    if vulkan {
        let sdk = var("VULKAN_SDK").map(PathBuf::from);
        let bin: Vec<PathBuf> = sdk.iter().map(|s| s.join("bin")).collect();
        if find_program("glslc", &bin, path.as_deref()).is_none() {
            return Err(format!(
                "the `vulkan` feature needs glslc (the shader compiler), found nowhere. {INSTALL_VULKAN}"
            ));
        }
        let includes: Vec<PathBuf> = sdk
            .iter()
            .map(|s| s.join("include"))
            .chain(["/usr/local/include", "/usr/include"].map(PathBuf::from))
            .map(|d| d.join("vulkan").join("vulkan_core.h"))
            .collect();
        let Some(header) = includes.iter().find(|h| h.is_file()) else {
            return Err(format!(
                "the `vulkan` feature needs the Vulkan headers (vulkan/vulkan_core.h). {INSTALL_VULKAN}"
            ));
        };
        let text = std::fs::read_to_string(header).map_err(|e| format!("cannot read {}: {e}", header.display()))?;
        if let Some(problem) = vulkan_headers_problem(header, &text) {
            return Err(problem);
        }
    }
    if cuda {
        let nvcc = match var("CUDACXX") {
            Some(nvcc) if Path::new(&nvcc).is_file() => Some(PathBuf::from(nvcc)),
            Some(nvcc) => return Err(format!("CUDACXX={nvcc} is not a file. {INSTALL_CUDA}")),
            None => {
                let dirs: Vec<PathBuf> = var("CUDA_PATH")
                    .map(|p| PathBuf::from(p).join("bin"))
                    .into_iter()
                    .chain([PathBuf::from("/usr/local/cuda/bin")])
                    .collect();
                find_program("nvcc", &dirs, path.as_deref())
            }
        };
        if nvcc.is_none() {
            return Err(format!("the `cuda` feature needs nvcc, found nowhere. {INSTALL_CUDA}"));
        }
    }
    Ok(())
}
