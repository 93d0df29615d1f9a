//! The pure part of runtime CPU dispatch (build/cpu_variants.rs).

use crate::cpu_variants::{
    DEFAULT_VARIANTS, Setting, dispatches, group_signatures, rename_map, select, symbol_prefix, table_source,
    variant_defines, variants_in,
};

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn the_setting_parses_all_none_and_lists() {
    assert_eq!(Setting::parse(None), Ok(Setting::Default));
    assert_eq!(Setting::parse(Some("default")), Ok(Setting::Default));
    assert_eq!(Setting::parse(Some("all")), Ok(Setting::All));
    assert_eq!(Setting::parse(Some(" ALL ")), Ok(Setting::All));
    assert_eq!(Setting::parse(Some("none")), Ok(Setting::None));
    assert_eq!(Setting::parse(Some("off")), Ok(Setting::None));
    assert_eq!(Setting::parse(Some("haswell, zen4,")), Ok(Setting::Only(names(&["haswell", "zen4"]))));
    assert_eq!(Setting::parse(Some("armv8.2_1")), Ok(Setting::Only(names(&["armv8.2_1"]))));
    let err = Setting::parse(Some("haswell;rm -rf")).unwrap_err();
    assert!(err.contains("`haswell;rm -rf` is not a variant name"), "{err}");
}

#[test]
fn only_portable_x86_64_linux_builds_dispatch() {
    let all = Setting::All;
    assert!(dispatches(false, "linux", "x86_64", "gnu", &all));
    assert!(dispatches(false, "linux", "x86_64", "musl", &all));
    assert!(!dispatches(true, "linux", "x86_64", "gnu", &all), "native builds one backend for the build machine");
    assert!(!dispatches(false, "linux", "x86_64", "gnu", &Setting::None));
    assert!(!dispatches(false, "linux", "aarch64", "gnu", &all));
    assert!(!dispatches(false, "macos", "x86_64", "", &all));
    assert!(!dispatches(false, "windows", "x86_64", "msvc", &all));
}

const CMAKELISTS: &str = "ggml_add_cpu_backend_variant(x64)\n\
    ggml_add_cpu_backend_variant(sse42              SSE42)\n\
    ggml_add_cpu_backend_variant(haswell            SSE42 AVX F16C FMA AVX2 BMI2)\n\
    ggml_add_cpu_backend_variant(zen4           SSE42 AVX F16C FMA AVX2 BMI2 AVX512 AVX512_VBMI)\n";

#[test]
fn variants_are_found_in_the_build_in_ggml_order() {
    let dirs = names(&[
        "ggml-base.dir",
        "ggml.dir",
        "ggml-cpu-zen4.dir",
        "ggml-cpu-zen4-feats.dir",
        "ggml-cpu-x64.dir",
        "ggml-cpu-x64-feats.dir",
        "ggml-cpu-haswell.dir",
        "ggml-cpu-sse42.dir",
        "ggml-cpu.dir",
    ]);
    assert_eq!(variants_in(&dirs, CMAKELISTS), names(&["x64", "sse42", "haswell", "zen4"]));
}

#[test]
fn selection_keeps_ggml_order_and_always_the_baseline() {
    let available = names(&["x64", "sse42", "haswell", "zen4"]);
    assert_eq!(select(&Setting::All, &available, "x86_64").unwrap(), available);
    assert_eq!(
        select(&Setting::Only(names(&["zen4", "haswell"])), &available, "x86_64").unwrap(),
        names(&["x64", "haswell", "zen4"]),
        "the baseline is added, and the order is ggml's"
    );
    let err = select(&Setting::Only(names(&["haswel"])), &available, "x86_64").unwrap_err();
    assert!(err.contains("no CPU variant `haswel`") && err.contains("x64, sse42, haswell, zen4"), "{err}");
    let err = select(&Setting::All, &names(&["haswell"]), "x86_64").unwrap_err();
    assert!(err.contains("no `x64`"), "{err}");
}

/// The default set: every variant of ggml's x86-64 list but the four for
/// old or rare CPUs and the AMX one, in ggml's order, the baseline first.
#[test]
fn the_default_builds_the_variants_of_common_cpus() {
    let ggml = names(&[
        "x64",
        "sse42",
        "sandybridge",
        "ivybridge",
        "piledriver",
        "haswell",
        "skylakex",
        "cannonlake",
        "cascadelake",
        "icelake",
        "cooperlake",
        "zen4",
        "alderlake",
        "sapphirerapids",
    ]);
    let chosen = select(&Setting::Default, &ggml, "x86_64").unwrap();
    assert_eq!(
        chosen,
        names(&["x64", "sse42", "sandybridge", "haswell", "skylakex", "cascadelake", "icelake", "zen4", "alderlake"])
    );
    assert_eq!(select(&Setting::All, &ggml, "x86_64").unwrap().len(), 13);
    // Every default variant is one ggml defines (a misspelt name would be
    // silently missing).
    assert!(DEFAULT_VARIANTS.iter().all(|v| ggml.iter().any(|g| g == v)));
}

#[test]
fn all_leaves_the_amx_variant_out_unless_it_is_named() {
    let available = names(&["x64", "haswell", "zen4", "sapphirerapids"]);
    assert_eq!(select(&Setting::All, &available, "x86_64").unwrap(), names(&["x64", "haswell", "zen4"]));
    assert_eq!(
        select(&Setting::Only(names(&["sapphirerapids"])), &available, "x86_64").unwrap(),
        names(&["x64", "sapphirerapids"])
    );
}

#[test]
fn the_variant_build_is_ggmls_module_build_without_other_backends() {
    let main: Vec<(&'static str, String)> = vec![
        ("CMAKE_BUILD_TYPE", "Release".into()),
        ("BUILD_SHARED_LIBS", "OFF".into()),
        ("GGML_OPENMP", "ON".into()),
        ("GGML_NATIVE", "OFF".into()),
        ("GGML_CPU", "OFF".into()),
        ("GGML_CUDA", "ON".into()),
        ("GGML_RPC", "ON".into()),
        ("GGML_AVX2", "OFF".into()),
        ("GGML_SANITIZE_ADDRESS", "ON".into()),
    ];
    let d = variant_defines(&main);
    let get = |k: &str| d.iter().rev().find(|(key, _)| *key == k).map(|(_, v)| v.as_str());
    assert_eq!(get("CMAKE_BUILD_TYPE"), Some("Release"));
    assert_eq!(get("GGML_OPENMP"), Some("ON"));
    assert_eq!(get("GGML_SANITIZE_ADDRESS"), Some("ON"));
    assert_eq!(get("BUILD_SHARED_LIBS"), Some("ON"), "ggml builds variants only as modules");
    assert_eq!(get("GGML_BACKEND_DL"), Some("ON"));
    assert_eq!(get("GGML_CPU_ALL_VARIANTS"), Some("ON"));
    assert_eq!(get("GGML_CUDA"), Some("OFF"), "a GPU backend is built once, in the main build");
    assert_eq!(get("GGML_RPC"), Some("OFF"));
    assert_eq!(get("GGML_CPU"), None, "the main build's CPU switch is not the variants'");
    assert_eq!(get("GGML_AVX2"), None, "each variant sets its own instruction sets");
}

#[test]
fn every_defined_symbol_is_renamed_and_no_undefined_one() {
    // `nm -g -P --defined-only` of a variant object, plus lines it would
    // not print with --defined-only, which must be left alone anyway.
    let nm = "ggml_backend_init T 0000000000000000 0000000000000010\n\
              ggml_backend_score T 0000000000000010 0000000000000020\n\
              _ZNSt6vectorIfSaIfEE17_M_realloc_insertIJRKfEEEvN9__gnu_cxx17__normal_iteratorIPfS1_EEDpOT_ W 0 10\n\
              ggml_table_f32_f16 B 0000000000000000 0000000000040000\n\
              _ZTVN4ggml3cpu6repack13tensor_traitsE V 0 40\n\
              ggml_new_tensor U\n\
              __cxa_pure_virtual w\n\
              DW.ref.__gxx_personality_v0 V 0 8\n\
              DW.ref.__gxx_personality_v0 V 0 8\n";
    let prefix = symbol_prefix("haswell");
    assert_eq!(prefix, "llama_sys_cpu_haswell__");
    let map = rename_map(nm, &[], &prefix);
    let lines: Vec<&str> = map.lines().collect();
    assert_eq!(lines.len(), 6, "{map}");
    assert_eq!(map.matches("DW.ref.__gxx_personality_v0 ").count(), 1, "a weak symbol of two objects is named once");
    assert_eq!(lines[0], "ggml_backend_init llama_sys_cpu_haswell__ggml_backend_init");
    assert!(lines.iter().any(|l| l.starts_with("_ZNSt6vector") && l.contains(" llama_sys_cpu_haswell___ZNSt6vector")));
    assert!(lines.iter().any(|l| l.starts_with("_ZTVN4ggml3cpu6repack13tensor_traitsE ")));
    assert!(!map.contains("ggml_new_tensor"), "ggml-base's functions stay shared");
    assert!(!map.contains("__cxa_pure_virtual"));
    assert_eq!(symbol_prefix("armv8.2_1"), "llama_sys_cpu_armv8_2_1__");
}

#[test]
fn the_table_declares_and_lists_every_variant_in_order() {
    let src = table_source(&names(&["x64", "haswell"]));
    assert!(src.contains("int llama_sys_cpu_x64__ggml_backend_score(void);"));
    assert!(src.contains("ggml_backend_reg * llama_sys_cpu_haswell__ggml_backend_init(void);"));
    let x64 = src.find("{\"x64\", llama_sys_cpu_x64__ggml_backend_score, llama_sys_cpu_x64__ggml_backend_init}");
    let haswell =
        src.find("{\"haswell\", llama_sys_cpu_haswell__ggml_backend_score, llama_sys_cpu_haswell__ggml_backend_init}");
    assert!(x64.is_some() && haswell.is_some() && x64 < haswell, "{src}");
    assert!(src.contains("llama_sys_cpu_variant_count = 2;"));
}

#[test]
fn comdat_group_signatures_are_renamed_too() {
    // `readelf -g -W` of a variant object: a constructor's group is named
    // by a local symbol, which `nm -g` does not list.
    let readelf = "\nCOMDAT group section [    3] `.group' [_ZN31ggml_backend_cpu_device_contextD5Ev] contains 2 sections:\n   \
                   [Index]    Name\n   [   22]   .text._ZN31ggml_backend_cpu_device_contextD2Ev\n\n\
                   COMDAT group section [    4] `.group' [_ZN31ggml_backend_cpu_device_contextC5Ev] contains 3 sections:\n\
                   COMDAT group section [    8] `.group' [DW.ref.__gxx_personality_v0] contains 2 sections:\n";
    let signatures = group_signatures(readelf);
    assert_eq!(
        signatures,
        names(&[
            "_ZN31ggml_backend_cpu_device_contextD5Ev",
            "_ZN31ggml_backend_cpu_device_contextC5Ev",
            "DW.ref.__gxx_personality_v0"
        ])
    );
    let nm = "DW.ref.__gxx_personality_v0 V 0 8\n_ZN31ggml_backend_cpu_device_contextC1Ev W 0 10\n";
    let map = rename_map(nm, &signatures, "p__");
    assert!(map.contains("_ZN31ggml_backend_cpu_device_contextC5Ev p___ZN31ggml_backend_cpu_device_contextC5Ev\n"));
    assert!(map.contains("_ZN31ggml_backend_cpu_device_contextC1Ev p___ZN31ggml_backend_cpu_device_contextC1Ev\n"));
    assert_eq!(map.matches("DW.ref.__gxx_personality_v0 ").count(), 1, "{map}");
    assert_eq!(map.lines().count(), 4, "{map}");
}
