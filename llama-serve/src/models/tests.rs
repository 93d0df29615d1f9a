use std::fs;

use super::*;

/// Writes `files` (paths relative to `dir`) with a few bytes each.
fn touch(dir: &Path, files: &[&str]) {
    for f in files {
        let path = dir.join(f);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, b"GGUF").unwrap();
    }
}

#[test]
fn a_folder_lists_files_split_models_and_subfolders_with_projectors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    touch(
        d,
        &[
            "a.gguf",
            "mmproj-a.gguf",
            "big-00001-of-00002.gguf",
            "big-00002-of-00002.gguf",
            "notes.txt",
            "split/s-00001-of-00002.gguf",
            "split/s-00002-of-00002.gguf",
            "vision/model-q4.gguf",
            "vision/mmproj-model-f16.gguf",
        ],
    );
    let catalog = Catalog::from_dir(d).unwrap();
    let names: Vec<&str> = catalog.models().iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["a", "big", "split", "vision"]);
    assert_eq!(catalog.get("big").unwrap().path, d.join("big-00001-of-00002.gguf"));
    assert_eq!(catalog.get("split").unwrap().path, d.join("split/s-00001-of-00002.gguf"));
    let vision = catalog.get("vision").unwrap();
    assert_eq!(vision.path, d.join("vision/model-q4.gguf"));
    assert_eq!(vision.projector.as_deref(), Some(d.join("vision/mmproj-model-f16.gguf").as_path()));
    assert_eq!(catalog.get("a").unwrap().projector, None, "a top-level projector belongs to no model");
}

#[test]
fn a_folder_that_does_not_hold_models_as_laid_out_is_an_error() {
    let err = |files: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        touch(dir.path(), files);
        Catalog::from_dir(dir.path()).unwrap_err().0
    };
    assert!(err(&["big-00001-of-00003.gguf", "big-00002-of-00003.gguf"]).ends_with("part 3 of 3 is missing"));
    assert!(err(&["two/a.gguf", "two/b.gguf"]).ends_with("2 models in one folder; a folder holds one model"));
    assert!(err(&["empty/mmproj.gguf"]).ends_with("no model (*.gguf) in the folder"));
    assert!(err(&["x.gguf", "x/model.gguf"]).ends_with("two models are named \"x\""));
    assert!(err(&["notes.txt"]).ends_with("no *.gguf model in the folder or its subfolders"));
    let missing = Catalog::from_dir(Path::new("/nonexistent/models")).unwrap_err().0;
    assert!(missing.starts_with("/nonexistent/models: "), "{missing}");
}

const FILE: &str = r#"
[defaults]
ctx = 8192
keep-alive = "10m"

[models.gemma]
path = "gemma.gguf"
aliases = ["small", "gemma:270m"]
projector = "vision/mmproj.gguf"
parallel = 2

[models.coder]
path = "sub/coder.gguf"
ctx = 4096
template-file = "coder.jinja"
embeddings = false
"#;

#[test]
fn a_models_file_gives_names_aliases_paths_and_settings_over_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    touch(d, &["gemma.gguf", "vision/mmproj.gguf", "sub/coder.gguf"]);
    fs::write(d.join("models.toml"), FILE).unwrap();
    let catalog = Catalog::from_file(&d.join("models.toml")).unwrap();
    let gemma = catalog.get("gemma:270m").unwrap();
    assert_eq!(gemma.name, "gemma");
    assert_eq!(catalog.get("small"), Some(gemma));
    assert_eq!(gemma.path, d.join("gemma.gguf"));
    assert_eq!(gemma.projector.as_deref(), Some(d.join("vision/mmproj.gguf").as_path()));
    assert_eq!(gemma.settings.ctx, Some(8192), "from [defaults]");
    assert_eq!(gemma.settings.parallel, Some(2));
    assert_eq!(gemma.settings.keep_alive.as_deref(), Some("10m"));
    let coder = catalog.get("coder").unwrap();
    assert_eq!(coder.settings.ctx, Some(4096), "its own value over the default");
    assert_eq!(coder.settings.template_file.as_deref(), Some(d.join("coder.jinja").as_path()));
    assert_eq!(coder.settings.embeddings, Some(false));
    assert_eq!(coder.settings.parallel, None);
}

#[test]
fn a_bad_models_file_is_one_line_naming_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    touch(d, &["gemma.gguf", "coder.gguf"]);
    let err = |text: &str| {
        let path = d.join("models.toml");
        fs::write(&path, text).unwrap();
        let e = Catalog::from_file(&path).unwrap_err().0;
        assert!(!e.contains('\n'), "one line: {e}");
        e.strip_prefix(&format!("{}:", path.display())).unwrap_or(&e).to_owned()
    };
    let unknown = err("[models.gemma]\npath = \"gemma.gguf\"\ncontext = 4096\n");
    assert!(unknown.starts_with("3: unknown field `context`"), "{unknown}");
    let missing = err("[models.gemma]\npath = \"gemma.gguf\"\n\n[models.coder]\npath = \"nope.gguf\"\n");
    assert!(missing.starts_with("5: the model ") && missing.ends_with("nope.gguf is not a file"), "{missing}");
    let twice = err(
        "[models.gemma]\npath = \"gemma.gguf\"\naliases = [\"g\"]\n[models.coder]\npath = \"coder.gguf\"\naliases = [\n  \"x\",\n  \"g\",\n]\n",
    );
    assert_eq!(twice, "8: the name \"g\" is used twice");
    let alias_of_a_name =
        err("[models.gemma]\npath = \"gemma.gguf\"\naliases = [\"coder\"]\n[models.coder]\npath = \"coder.gguf\"\n");
    assert_eq!(alias_of_a_name, "3: the name \"coder\" is used twice");
    let wrong_type = err("[defaults]\nctx = \"big\"\n[models.gemma]\npath = \"gemma.gguf\"\n");
    assert!(wrong_type.starts_with("2: invalid type"), "{wrong_type}");
    let path_name = err("[models.\"../gemma\"]\npath = \"gemma.gguf\"\n");
    assert!(path_name.contains("must be 1 to 128 letters"), "{path_name}");
    assert!(err("[defaults]\nctx = 1\n").ends_with("no [models.NAME] table"));
}

#[test]
fn a_name_is_looked_up_exactly_never_as_a_path() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    touch(d, &["gemma.gguf", "other/secret.gguf"]);
    fs::write(d.join("models.toml"), "[models.gemma]\npath = \"gemma.gguf\"\n").unwrap();
    let catalog = Catalog::from_file(&d.join("models.toml")).unwrap();
    let long = "g".repeat(100_000);
    for name in ["gemma.gguf", "./gemma", "../gemma", "other/secret", d.join("gemma.gguf").to_str().unwrap(), "", &long]
    {
        assert_eq!(catalog.get(name), None, "{name:.40}");
    }
    assert!(catalog.get("gemma").is_some());
}

#[test]
fn split_parts_are_read_by_their_numbers() {
    assert_eq!(split_part("big-00001-of-00003"), Some(("big", 1, 3)));
    assert_eq!(split_part("a-b-00002-of-00002"), Some(("a-b", 2, 2)));
    assert_eq!(split_part("big-00004-of-00003"), None);
    assert_eq!(split_part("big-1-of-3"), None);
    assert_eq!(split_part("gemma-3-270m"), None);
}
