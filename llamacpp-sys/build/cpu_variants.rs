//! Runtime CPU dispatch, the pure part: which builds dispatch, which of
//! ggml's CPU variants they compile, the CMake defines of the variant
//! build, the symbol renaming and the generated variant table. No I/O, so
//! `src/cpu_variants_tests.rs` tests all of it; build/dispatch.rs runs it.
//!
//! ggml compiles its CPU backend once per CPU level it defines (x86-64:
//! x64, sse42, sandybridge, …, haswell, skylakex, icelake, zen4,
//! sapphirerapids) only as shared modules that it loads from a folder next
//! to the executable, choosing the best by each module's score. A library
//! cannot ask its users to ship a folder of modules, so here the same
//! variants are linked statically: every symbol a variant defines is
//! renamed with a per-variant prefix, so fifteen copies of the backend sit
//! side by side in one archive, and a small dispatcher
//! (`shim/cpu_dispatch.cpp`) defines `ggml_backend_cpu_reg`, which ggml's
//! registry calls: it asks every variant's score function (compiled without
//! the variant's instruction set, by ggml's design) and registers the best.

/// `LLAMA_SYS_CPU_VARIANTS`: which of ggml's CPU variants to build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Setting {
    /// Unset: [`DEFAULT_VARIANTS`], the variants today's common CPUs run.
    Default,
    /// `all`: every variant ggml defines for the target.
    All,
    /// `none`: no dispatch; one CPU backend for the Rust target's CPU level
    /// (baseline x86-64 unless `-C target-cpu` says more), as before.
    None,
    /// A comma-separated list; the baseline variant is always added, so a
    /// binary runs on every CPU of its target.
    Only(Vec<String>),
}

impl Setting {
    pub fn parse(value: Option<&str>) -> Result<Setting, String> {
        let Some(value) = value.map(str::trim) else { return Ok(Setting::Default) };
        match value.to_ascii_lowercase().as_str() {
            "" | "default" => Ok(Setting::Default),
            "all" => Ok(Setting::All),
            "none" | "off" => Ok(Setting::None),
            _ => {
                let names: Vec<String> =
                    value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect();
                if let Some(bad) =
                    names.iter().find(|n| !n.chars().all(|c| c.is_ascii_alphanumeric() || "._".contains(c)))
                {
                    return Err(format!(
                        "LLAMA_SYS_CPU_VARIANTS: `{bad}` is not a variant name (`all`, `none`, or names such as \
                         `x64,haswell,zen4`)"
                    ));
                }
                Ok(Setting::Only(names))
            }
        }
    }
}

/// The variant every CPU of the target runs, always built.
pub fn baseline(arch: &str) -> Option<&'static str> {
    match arch {
        "x86_64" => Some("x64"),
        _ => None,
    }
}

/// Whether a build dispatches: x86-64 Linux, not `native`, not turned off.
/// Elsewhere the one CPU backend follows the Rust target (see the docs):
/// macOS and Windows toolchains have no objcopy, and aarch64 Linux has not
/// been run here.
pub fn dispatches(native: bool, os: &str, arch: &str, env: &str, setting: &Setting) -> bool {
    !native && os == "linux" && baseline(arch).is_some() && env != "msvc" && *setting != Setting::None
}

/// Variants `all` leaves out; naming one in the list builds it.
/// sapphirerapids is the one with ggml's AMX kernels, which crash at the
/// pinned commit on the default model (SIGSEGV in `ggml_backend_amx_mul_mat`,
/// seen on an Intel Xeon with AMX on 2026-12-03; llama.cpp issue 20824).
/// Without it such a CPU gets the best variant below (zen4: AVX-512 with
/// VBMI, VNNI and BF16).
pub const LEFT_OUT_OF_ALL: &[&str] = &["sapphirerapids"];

/// The variants built by default: the one each of today's common x86-64
/// CPUs picks, so that none of them runs slower than with every variant
/// built (ggml gives a CPU the best variant it supports, and each of
/// these CPUs supports its own): Intel's client cores from Haswell on
/// (`haswell`; `alderlake` from the 12th generation, with AVX-VNNI), their
/// servers from Skylake-SP (`skylakex`, `cascadelake`, `icelake`; Sapphire
/// Rapids and later take `zen4`, see [`LEFT_OUT_OF_ALL`]), AMD's Zen 1 to 3
/// (`haswell`) and Zen 4 and 5 (`zen4`), and the floor for older ones
/// (`x64`, `sse42`, `sandybridge`). Left out, for CPUs of 2012 to 2015 and
/// two rare server parts, which then take the next variant down:
/// `ivybridge` (Ivy Bridge: `sandybridge`, without F16C), `piledriver`
/// (AMD's Piledriver to Excavator: `ivybridge`'s loss and FMA's),
/// `cannonlake` (a 2018 laptop part: `skylakex`) and `cooperlake` (a
/// four-socket Xeon: `cascadelake`, without BF16). docs/building.md has
/// what that costs and what it saves.
pub const DEFAULT_VARIANTS: &[&str] =
    &["x64", "sse42", "sandybridge", "haswell", "skylakex", "cascadelake", "icelake", "zen4", "alderlake"];

/// The variants to build, in the order ggml's CMakeLists.txt defines them
/// (`available`, found in the configured build), or why not.
pub fn select(setting: &Setting, available: &[String], arch: &str) -> Result<Vec<String>, String> {
    let base = baseline(arch).ok_or_else(|| format!("no CPU variants for {arch}"))?;
    if !available.iter().any(|v| v == base) {
        return Err(format!("ggml defines no `{base}` CPU variant here (found: {})", available.join(", ")));
    }
    match setting {
        Setting::Default => {
            Ok(available.iter().filter(|v| *v == base || DEFAULT_VARIANTS.contains(&v.as_str())).cloned().collect())
        }
        Setting::All => Ok(available.iter().filter(|v| !LEFT_OUT_OF_ALL.contains(&v.as_str())).cloned().collect()),
        Setting::None => Ok(Vec::new()),
        Setting::Only(names) => {
            if let Some(unknown) = names.iter().find(|n| !available.contains(n)) {
                return Err(format!(
                    "LLAMA_SYS_CPU_VARIANTS: ggml defines no CPU variant `{unknown}` for {arch}; it defines: {}",
                    available.join(", ")
                ));
            }
            Ok(available.iter().filter(|v| *v == base || names.contains(v)).cloned().collect())
        }
    }
}

/// The variant names in a configured build: `ggml-cpu-<name>.dir` folders
/// (not the `-feats` object libraries), in ggml's order when `order` (the
/// configure log or CMakeLists.txt text) names them, else sorted.
pub fn variants_in(dir_names: &[String], order: &str) -> Vec<String> {
    let mut names: Vec<String> = dir_names
        .iter()
        .filter_map(|d| d.strip_prefix("ggml-cpu-")?.strip_suffix(".dir").map(str::to_owned))
        .filter(|n| !n.ends_with("-feats") && !n.is_empty())
        .collect();
    let position = |n: &String| {
        order
            .find(&format!("ggml_add_cpu_backend_variant({n} "))
            .or_else(|| order.find(&format!("ggml_add_cpu_backend_variant({n})")))
    };
    names.sort_by(|a, b| position(a).cmp(&position(b)).then_with(|| a.cmp(b)));
    names
}

/// The CMake defines of the variant build, from the main build's: ggml's
/// shared-module configuration with every CPU variant, no GPU or network
/// backend (the main build has those), and the same build type, OpenMP
/// and sanitizer.
pub fn variant_defines(main: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    const KEPT: &[&str] = &[
        "CMAKE_BUILD_TYPE",
        "CMAKE_POSITION_INDEPENDENT_CODE",
        "CMAKE_INSTALL_LIBDIR",
        "LLAMA_BUILD_COMMON",
        "LLAMA_BUILD_TESTS",
        "LLAMA_BUILD_EXAMPLES",
        "LLAMA_BUILD_TOOLS",
        "LLAMA_BUILD_SERVER",
        "LLAMA_BUILD_APP",
        "LLAMA_OPENSSL",
        "LLAMA_BUILD_NUMBER",
        "LLAMA_BUILD_COMMIT",
        "GGML_CCACHE",
        "GGML_OPENMP",
        "LLAMA_SANITIZE_ADDRESS",
        "GGML_SANITIZE_ADDRESS",
    ];
    let mut d: Vec<(&'static str, String)> = main.iter().filter(|(k, _)| KEPT.contains(k)).cloned().collect();
    for (k, v) in [
        ("BUILD_SHARED_LIBS", "ON"),
        ("GGML_BACKEND_DL", "ON"),
        ("GGML_CPU_ALL_VARIANTS", "ON"),
        ("GGML_NATIVE", "OFF"),
        ("GGML_CUDA", "OFF"),
        ("GGML_METAL", "OFF"),
        ("GGML_VULKAN", "OFF"),
        ("GGML_RPC", "OFF"),
        ("GGML_BLAS", "OFF"),
    ] {
        d.push((k, v.to_owned()));
    }
    d
}

/// The prefix every symbol of `variant` gets: `llama_sys_cpu_<variant>__`,
/// with `.` (armv8.2_1) made an identifier character.
pub fn symbol_prefix(variant: &str) -> String {
    format!("llama_sys_cpu_{}__", variant.replace(['.', '-'], "_"))
}

/// `objcopy --redefine-syms` lines for one variant: every symbol its
/// objects define, from `nm -g -P --defined-only` output (`name type value
/// size` per line) of all of them, so that references between them follow,
/// and every COMDAT group signature (`group_signatures`). Defined global,
/// weak and unique symbols are all renamed: a variant's inline functions
/// and template instances are compiled with its instruction set, so they
/// must not be merged with another variant's. So are the groups: the
/// linker keeps one group per signature, and a constructor's group is
/// named by a local symbol (`…C5Ev`) that the other renaming misses, so the
/// other variants' copies would be dropped and their references left null.
pub fn rename_map(nm_output: &str, signatures: &[String], prefix: &str) -> String {
    let mut out = String::new();
    let mut seen = std::collections::HashSet::new();
    let defined = nm_output.lines().filter_map(|line| {
        let mut fields = line.split_whitespace();
        let (name, kind) = (fields.next()?, fields.next()?);
        // U: undefined (ggml-base, libc, libstdc++): left alone.
        (kind != "U" && kind != "w" && kind != "v").then_some(name)
    });
    for name in defined.chain(signatures.iter().map(String::as_str)) {
        // A weak symbol several objects define is named once.
        if !seen.insert(name) {
            continue;
        }
        out.push_str(name);
        out.push(' ');
        out.push_str(prefix);
        out.push_str(name);
        out.push('\n');
    }
    out
}

/// The COMDAT group signatures in `readelf -g -W` output: the bracketed
/// name in each ``COMDAT group section [    4] `.group' [NAME] contains``.
pub fn group_signatures(readelf_output: &str) -> Vec<String> {
    readelf_output
        .lines()
        .filter(|l| l.starts_with("COMDAT group section"))
        .filter_map(|l| {
            let rest = &l[l.find("`.group'")? + "`.group'".len()..];
            let start = rest.find('[')? + 1;
            let end = rest.rfind("] contains")?;
            (start < end).then(|| rest[start..end].to_owned())
        })
        .collect()
}

/// The C++ source of the variant table the dispatcher reads: each
/// variant's renamed score and init entry points (GGML_BACKEND_DL_IMPL and
/// GGML_BACKEND_DL_SCORE_IMPL in ggml), in build order.
pub fn table_source(variants: &[String]) -> String {
    let mut s = String::from(
        "// Generated by llamacpp-sys's build script (build/cpu_variants.rs): the CPU variants linked into \
         this build.\n#include <cstddef>\n\nstruct ggml_backend_reg;\n\nextern \"C\" {\n",
    );
    for v in variants {
        let p = symbol_prefix(v);
        s.push_str(&format!("int {p}ggml_backend_score(void);\nggml_backend_reg * {p}ggml_backend_init(void);\n"));
    }
    s.push_str(
        "\nstruct llama_sys_cpu_variant_entry {\n    const char * name;\n    int (*score)(void);\n    \
         ggml_backend_reg * (*init)(void);\n};\n\nextern const llama_sys_cpu_variant_entry llama_sys_cpu_variant_table[] = {\n",
    );
    for v in variants {
        let p = symbol_prefix(v);
        s.push_str(&format!("    {{\"{v}\", {p}ggml_backend_score, {p}ggml_backend_init}},\n"));
    }
    s.push_str(&format!("}};\nextern const std::size_t llama_sys_cpu_variant_count = {};\n}}\n", variants.len()));
    s
}
