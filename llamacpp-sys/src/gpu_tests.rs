//! The GPU toolchain checks of build/gpu.rs: the Vulkan headers' version.

use std::path::Path;

use crate::gpu::{vulkan_header_version, vulkan_headers_problem};

/// The lines of vulkan_core.h that carry the version (Debian 12's and 13's).
fn header(minor: u32, patch: u32) -> String {
    format!(
        "// Version of this file\n#define VK_HEADER_VERSION {patch}\n\n\
         // Complete version of this file\n\
         #define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, {minor}, VK_HEADER_VERSION)\n"
    )
}

#[test]
fn the_vulkan_header_version_is_read_from_vulkan_core_h() {
    assert_eq!(vulkan_header_version(&header(3, 239)), Some((1, 3, 239)));
    assert_eq!(vulkan_header_version(&header(4, 309)), Some((1, 4, 309)));
    assert_eq!(vulkan_header_version("#define VK_HEADER_VERSION 309\n"), None, "no complete version");
    assert_eq!(vulkan_header_version(""), None);
}

#[test]
fn headers_older_than_ggml_needs_are_refused_with_what_to_install() {
    let path = Path::new("/usr/include/vulkan/vulkan_core.h");
    let problem = vulkan_headers_problem(path, &header(3, 239)).unwrap();
    assert!(problem.contains("1.3.272 or newer") && problem.contains("has 1.3.239"), "{problem}");
    assert!(problem.contains("VULKAN_SDK") && problem.contains("glslc"), "{problem}");
    assert_eq!(vulkan_headers_problem(path, &header(3, 272)), None);
    assert_eq!(vulkan_headers_problem(path, &header(4, 309)), None);
    assert!(vulkan_headers_problem(path, "garbage").unwrap().contains("cannot read"));
}
