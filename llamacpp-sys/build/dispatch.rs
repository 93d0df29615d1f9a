//! Runtime CPU dispatch, the I/O part (the pure part and the reasons are in
//! build/cpu_variants.rs): a second CMake configuration of the same source
//! builds ggml's CPU variants as it would for its own loader, their object
//! files get every defined symbol renamed per variant (`nm`, `readelf` and `objcopy`
//! from binutils), and they go into one static archive with the
//! dispatcher, `shim/cpu_dispatch.cpp`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cpu_variants::{self, Setting};
use crate::env;
use crate::features::CPU_DISPATCH_LIB;
use crate::native;
use crate::source::{Tree, fail};

/// The dispatching CPU backend, ready to link.
pub struct Dispatch {
    /// Where `lib<CPU_DISPATCH_LIB>.a` is.
    pub lib_dir: PathBuf,
    /// The variants in it, in ggml's order (the baseline first).
    pub variants: Vec<String>,
}

/// The version of the renaming below, for the stamp.
const RENAMING: &str = "renaming-3";

const INSTALL_BINUTILS: &str = "runtime CPU dispatch renames the symbols of ggml's CPU variants with `nm`, \
    `readelf` and `objcopy` from binutils: install binutils (Debian/Ubuntu `apt install binutils`, Fedora `dnf install \
    binutils`), set NM, READELF and OBJCOPY (the llvm- ones work), or build one CPU backend instead with \
    LLAMA_SYS_CPU_VARIANTS=none (portable) or the `native` feature";

pub fn build(
    src: &Tree,
    install: &native::Install,
    setting: &Setting,
    arch: &str,
    cmake: &Path,
    build_root: &Path,
    out_dir: &Path,
) -> Dispatch {
    let tools = Tools::find();

    let defines = native::with_user_defines(&cpu_variants::variant_defines(&install.defines));
    let (prefix, _lock) = native::keyed_folder(src, cmake, build_root, "cpu-variants", &defines, &[], &[]);
    let build_dir = prefix.join("build");

    // Configure, and build ggml-base, which the variant modules link.
    let mut config = native::config(src, cmake, &prefix, &install.build_type, &defines);
    config.build_target("ggml-base");
    config.build();

    let cmake_files = build_dir.join("ggml").join("src").join("CMakeFiles");
    let dir_names: Vec<String> = fs::read_dir(&cmake_files)
        .unwrap_or_else(|e| fail(&format!("cannot list {}: {e}", cmake_files.display())))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    let order = fs::read_to_string(src.root.join("ggml").join("src").join("CMakeLists.txt")).unwrap_or_default();
    let available = cpu_variants::variants_in(&dir_names, &order);
    let variants = cpu_variants::select(setting, &available, arch).unwrap_or_else(|e| fail(&e));

    let renamed_dir = prefix.join("renamed");
    let stamp = prefix.join("renamed.done");
    // The stamp names the variants and how their objects were made, so a
    // change to either redoes the renaming.
    let expected = format!("{RENAMING} {}", variants.join(","));
    if fs::read_to_string(&stamp).ok().as_deref() != Some(expected.as_str()) {
        let _ = fs::remove_file(&stamp);
        build_variants(cmake, &build_dir, &install.build_type, &variants);
        let _ = fs::remove_dir_all(&renamed_dir);
        fs::create_dir_all(&renamed_dir).unwrap();
        for v in &variants {
            rename_variant(&tools, &cmake_files, v, &renamed_dir);
        }
        fs::write(&stamp, &expected).unwrap();
    }

    // The table and the dispatcher, archived with the renamed objects.
    let table = out_dir.join("cpu_variants.cpp");
    fs::write(&table, cpu_variants::table_source(&variants)).unwrap();
    let mut objects: Vec<PathBuf> = fs::read_dir(&renamed_dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "o"))
        .collect();
    objects.sort();
    let lib_dir = out_dir.join("cpu-dispatch");
    fs::create_dir_all(&lib_dir).unwrap();
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file(Path::new("shim").join("cpu_dispatch.cpp"))
        .file(&table)
        .objects(&objects)
        .cargo_metadata(false)
        .out_dir(&lib_dir)
        .compile(CPU_DISPATCH_LIB);
    Dispatch { lib_dir, variants }
}

/// binutils' symbol tools: `NM`, `OBJCOPY`, `READELF`, else by name.
struct Tools {
    nm: String,
    objcopy: String,
    readelf: String,
}

impl Tools {
    fn find() -> Tools {
        let tool = |var: &str, name: &str| {
            let tool = env::var(var).unwrap_or_else(|| name.to_owned());
            if Command::new(&tool).arg("--version").output().is_err() {
                fail(&format!("cannot run `{tool}` (set {var} to another): {INSTALL_BINUTILS}"));
            }
            tool
        };
        Tools { nm: tool("NM", "nm"), objcopy: tool("OBJCOPY", "objcopy"), readelf: tool("READELF", "readelf") }
    }
}

/// `cmake --build` of the variant targets, with cargo's job count.
fn build_variants(cmake: &Path, build_dir: &Path, build_type: &str, variants: &[String]) {
    let mut command = Command::new(cmake);
    command.arg("--build").arg(build_dir).args(["--config", build_type, "--target"]);
    command.args(variants.iter().map(|v| format!("ggml-cpu-{v}")));
    let jobs = std::env::var("NUM_JOBS").unwrap_or_else(|_| "1".to_owned());
    command.args(["--parallel", &jobs]);
    println!("llamacpp-sys: building the CPU variants {}: {command:?}", variants.join(", "));
    let status = command.status().unwrap_or_else(|e| fail(&format!("cannot run {command:?}: {e}")));
    if !status.success() {
        fail(&format!("building ggml's CPU variants failed ({status}): {command:?}"));
    }
}

/// Copies every object file of `variant` (its module and its feature
/// probe) into `out`, with every symbol it defines renamed.
fn rename_variant(tools: &Tools, cmake_files: &Path, variant: &str, out: &Path) {
    let prefix = cpu_variants::symbol_prefix(variant);
    let mut objects = Vec::new();
    for dir in [format!("ggml-cpu-{variant}.dir"), format!("ggml-cpu-{variant}-feats.dir")] {
        collect_objects(&cmake_files.join(dir), &mut objects);
    }
    if objects.is_empty() {
        fail(&format!("the build of CPU variant {variant} left no object files in {}", cmake_files.display()));
    }
    // One map for the whole variant: a symbol one object defines is
    // renamed where another object of the variant refers to it too.
    let mut listing = String::new();
    let mut signatures = Vec::new();
    for object in &objects {
        listing.push_str(&run(Command::new(&tools.nm).args(["-g", "-P", "--defined-only"]).arg(object)));
        signatures
            .extend(cpu_variants::group_signatures(&run(Command::new(&tools.readelf).args(["-g", "-W"]).arg(object))));
    }
    let map = out.join(format!("{variant}.syms"));
    fs::write(&map, cpu_variants::rename_map(&listing, &signatures, &prefix)).unwrap();
    for object in objects {
        // One flat folder: `ar` keeps one member per file name.
        let relative = object.strip_prefix(cmake_files).unwrap_or(&object);
        let name: String = relative
            .to_string_lossy()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' })
            .collect();
        let renamed = out.join(name);
        run(Command::new(&tools.objcopy).arg(format!("--redefine-syms={}", map.display())).arg(&object).arg(&renamed));
    }
    let _ = fs::remove_file(&map);
}

fn collect_objects(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_objects(&path, out);
        } else if path.extension().is_some_and(|e| e == "o") {
            out.push(path);
        }
    }
}

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|e| fail(&format!("cannot run {command:?}: {e}")));
    if !output.status.success() {
        fail(&format!("{command:?} failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim()));
    }
    String::from_utf8_lossy(&output.stdout).into_owned()
}
