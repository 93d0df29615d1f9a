//! The models a server can serve, by name: read from a folder laid out as
//! llama-server's router reads one (`--models-dir`) or from a models file
//! (`--models FILE.toml`). Each model has a name (its file stem or folder
//! name), its aliases, its file (the first part of a split model), its
//! projector, and the settings it is served with. A name is looked up
//! exactly, never as a path: a request cannot reach a file the catalog
//! did not list.
//!
//! This is the reader the many-model server (issue 54) builds on; the
//! server does not read it yet.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

/// At most this many models in a catalog.
pub const MAX_MODELS: usize = 256;

/// A catalog that cannot be read: one line, naming the file and line
/// where there is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogError(pub String);

impl std::fmt::Display for CatalogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CatalogError {}

fn error(message: impl Into<String>) -> CatalogError {
    CatalogError(message.into())
}

/// How one model is served; unset fields take the `[defaults]` table's
/// value, then the server's flags.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ModelSettings {
    /// Context cells (`--ctx`).
    pub ctx: Option<u32>,
    /// Sequences decoded together (`--parallel`).
    pub parallel: Option<u32>,
    /// The KV cache's element type (`--kv-type`: f16, q8_0, …).
    pub kv_type: Option<String>,
    /// Layers on the GPU (`--gpu-layers`).
    pub gpu_layers: Option<i32>,
    /// A Jinja chat template to use instead of the model's.
    pub template_file: Option<PathBuf>,
    /// Serve `/v1/embeddings` (`--embeddings`).
    pub embeddings: Option<bool>,
    /// Speculative decoding by default (`--spec`).
    pub speculation: Option<bool>,
    /// How long an idle model stays loaded (`5m`, `30s`, `-1` never).
    pub keep_alive: Option<String>,
}

impl ModelSettings {
    /// These settings, with `defaults` where they are unset.
    fn or(self, defaults: &ModelSettings) -> ModelSettings {
        let d = defaults.clone();
        ModelSettings {
            ctx: self.ctx.or(d.ctx),
            parallel: self.parallel.or(d.parallel),
            kv_type: self.kv_type.or(d.kv_type),
            gpu_layers: self.gpu_layers.or(d.gpu_layers),
            template_file: self.template_file.or(d.template_file),
            embeddings: self.embeddings.or(d.embeddings),
            speculation: self.speculation.or(d.speculation),
            keep_alive: self.keep_alive.or(d.keep_alive),
        }
    }
}

/// One model of a catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelEntry {
    /// Its name: the file stem or folder name, or the name the models
    /// file gives it.
    pub name: String,
    /// Other names it answers to.
    pub aliases: Vec<String>,
    /// The model file (the first part of a split model: llama.cpp loads
    /// the others from beside it).
    pub path: PathBuf,
    /// Its projector (images and audio), if it has one.
    pub projector: Option<PathBuf>,
    /// How it is served.
    pub settings: ModelSettings,
}

/// The models a server can serve.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    models: Vec<ModelEntry>,
}

impl Catalog {
    /// The models, in the order they were read (a folder's by name, a
    /// file's as written).
    pub fn models(&self) -> &[ModelEntry] {
        &self.models
    }

    /// The model called `name` (its name or an alias, exactly).
    pub fn get(&self, name: &str) -> Option<&ModelEntry> {
        self.models.iter().find(|m| m.name == name || m.aliases.iter().any(|a| a == name))
    }

    /// The models of folder `dir`, as llama-server's router reads one:
    /// each `*.gguf` file is a model named by its stem; each subfolder
    /// holding one model (possibly split into `-00001-of-0000N.gguf`
    /// parts) is a model named by the folder, with its `mmproj*.gguf`
    /// projector if it has one. Projectors and later split parts are not
    /// models.
    ///
    /// # Errors
    /// A folder that cannot be read, a subfolder with no model or with
    /// more than one, a split model with a part missing, two models of
    /// one name, more than [`MAX_MODELS`], or none.
    pub fn from_dir(dir: &Path) -> Result<Catalog, CatalogError> {
        let mut models = Vec::new();
        for entry in sorted_entries(dir)? {
            let name = entry.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if entry.is_dir() {
                models.push(folder_model(&entry, &name)?);
            } else if let Some(stem) = name.strip_suffix(".gguf") {
                if is_projector(&name) {
                    continue;
                }
                match split_part(stem) {
                    Some((_, 1, _)) | None => {}
                    Some(_) => continue,
                }
                let (name, _) = check_parts(&entry, stem)?;
                models.push(ModelEntry {
                    name,
                    aliases: Vec::new(),
                    path: entry.clone(),
                    projector: None,
                    settings: ModelSettings::default(),
                });
            }
        }
        if models.is_empty() {
            return Err(error(format!("{}: no *.gguf model in the folder or its subfolders", dir.display())));
        }
        Catalog::checked(models, |name| format!("{}: two models are named {name:?}", dir.display()))
    }

    /// The models a models file lists:
    ///
    /// ```toml
    /// [defaults]
    /// ctx = 8192
    ///
    /// [models.gemma]
    /// path = "gemma-3-270m-q4_k_m.gguf"   # relative to this file's folder
    /// aliases = ["small"]
    /// projector = "mmproj-gemma.gguf"
    /// keep-alive = "10m"
    /// ```
    ///
    /// Each `[models.NAME]` table has a `path`, optional `aliases` and
    /// `projector`, and any [`ModelSettings`] key; `[defaults]` holds
    /// settings for every model.
    ///
    /// # Errors
    /// One line naming the file and line: a key the file may not have, a
    /// value of the wrong type, a path that is not a file, a name or alias
    /// used twice, more than [`MAX_MODELS`] models, or none.
    pub fn from_file(path: &Path) -> Result<Catalog, CatalogError> {
        let text = std::fs::read_to_string(path).map_err(|e| error(format!("{}: {e}", path.display())))?;
        let at = |span: std::ops::Range<usize>| {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!("{}:{line}", path.display())
        };
        let file: ModelsFile = toml::from_str(&text).map_err(|e| {
            let message = e.message().trim_end_matches('.').to_owned();
            match e.span() {
                Some(span) => error(format!("{}: {message}", at(key_span(&text, span, &message)))),
                None => error(format!("{}: {message}", path.display())),
            }
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |p: &Spanned<PathBuf>, what: &str| -> Result<PathBuf, CatalogError> {
            let full = base.join(p.get_ref());
            if full.is_file() {
                Ok(full)
            } else {
                Err(error(format!("{}: the {what} {} is not a file", at(p.span()), full.display())))
            }
        };
        let mut models = Vec::with_capacity(file.models.len());
        // Every model's name, so that an alias equal to any of them is
        // refused at its line.
        let mut names: std::collections::HashSet<String> = file.models.keys().cloned().collect();
        // In the file's order (a name used twice is reported where it is
        // used the second time).
        let mut tables: Vec<(String, ModelTable)> = file.models.into_iter().collect();
        tables.sort_by_key(|(_, t)| t.path.span().start);
        for (name, model) in tables {
            if !valid_name(&name) {
                return Err(error(format!(
                    "{}: the model name {name:?} must be 1 to 128 letters, digits or . _ - : characters",
                    path.display()
                )));
            }
            let mut aliases = Vec::with_capacity(model.aliases.len());
            for alias in &model.aliases {
                let a = alias.get_ref();
                if !valid_name(a) {
                    return Err(error(format!(
                        "{}: the alias {a:?} must be 1 to 128 letters, digits or . _ - : characters",
                        at(alias.span())
                    )));
                }
                if !names.insert(a.clone()) {
                    return Err(error(format!("{}: the name {a:?} is used twice", at(alias.span()))));
                }
                aliases.push(a.clone());
            }
            let settings = model.settings.or(&file.defaults);
            let settings = ModelSettings { template_file: settings.template_file.map(|t| base.join(t)), ..settings };
            models.push(ModelEntry {
                path: resolve(&model.path, "model")?,
                projector: model.projector.as_ref().map(|p| resolve(p, "projector")).transpose()?,
                name,
                aliases,
                settings,
            });
        }
        if models.is_empty() {
            return Err(error(format!("{}: no [models.NAME] table", path.display())));
        }
        Catalog::checked(models, |name| format!("{}: the name {name:?} is used twice", path.display()))
    }

    /// `models`, refused when there are too many or two share a name.
    fn checked(models: Vec<ModelEntry>, twice: impl Fn(&str) -> String) -> Result<Catalog, CatalogError> {
        if models.len() > MAX_MODELS {
            return Err(error(format!("{} models; at most {MAX_MODELS}", models.len())));
        }
        let mut seen = std::collections::HashSet::new();
        for m in &models {
            for name in std::iter::once(&m.name).chain(&m.aliases) {
                if !seen.insert(name.as_str()) {
                    return Err(error(twice(name)));
                }
            }
        }
        Ok(Catalog { models })
    }
}

/// `[models.NAME]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ModelTable {
    path: Spanned<PathBuf>,
    #[serde(default)]
    aliases: Vec<Spanned<String>>,
    projector: Option<Spanned<PathBuf>>,
    #[serde(flatten)]
    settings: ModelSettings,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelsFile {
    #[serde(default)]
    defaults: ModelSettings,
    #[serde(default)]
    models: BTreeMap<String, ModelTable>,
}

/// Where an error is: an unknown key's own line (a model's settings are
/// read through `flatten`, whose errors point at the whole table), else
/// the parser's span.
fn key_span(text: &str, span: std::ops::Range<usize>, message: &str) -> std::ops::Range<usize> {
    let Some(key) = message.strip_prefix("unknown field `").and_then(|m| m.split('`').next()) else { return span };
    // The table from where the span starts to the next table's header.
    let mut at = span.start;
    for (i, line) in text.get(span.start..).unwrap_or_default().split_inclusive('\n').enumerate() {
        if i > 0 && line.trim_start().starts_with('[') {
            break;
        }
        if line.split('=').nth(1).is_some() && line.split('=').next().is_some_and(|k| k.trim().trim_matches('"') == key)
        {
            return at..at + line.len();
        }
        at += line.len();
    }
    span
}

/// Names a request may use: short, and nothing a path is made of.
fn valid_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
        && !name.starts_with('.')
}

fn is_projector(file_name: &str) -> bool {
    file_name.starts_with("mmproj")
}

/// `(base, part, parts)` of a split model's stem `base-0000N-of-0000M`.
fn split_part(stem: &str) -> Option<(&str, u32, u32)> {
    let (rest, parts) = stem.rsplit_once("-of-")?;
    let (base, part) = rest.rsplit_once('-')?;
    let (part_n, parts_n) = (part.parse().ok()?, parts.parse().ok()?);
    (part.len() == 5 && parts.len() == 5 && part_n >= 1 && part_n <= parts_n).then_some((base, part_n, parts_n))
}

/// The model's name from its first file's stem, checking that every part
/// of a split model is there.
fn check_parts(first: &Path, stem: &str) -> Result<(String, u32), CatalogError> {
    let Some((base, _, parts)) = split_part(stem) else { return Ok((stem.to_owned(), 1)) };
    for n in 2..=parts {
        let part = first.with_file_name(format!("{base}-{n:05}-of-{parts:05}.gguf"));
        if !part.is_file() {
            return Err(error(format!("{}: part {n} of {parts} is missing", part.display())));
        }
    }
    Ok((base.to_owned(), parts))
}

/// A subfolder's one model and its projector.
fn folder_model(dir: &Path, name: &str) -> Result<ModelEntry, CatalogError> {
    let mut firsts = Vec::new();
    let mut projector = None;
    for file in sorted_entries(dir)? {
        let file_name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let Some(stem) = file_name.strip_suffix(".gguf") else { continue };
        if is_projector(&file_name) {
            if projector.replace(file.clone()).is_some() {
                return Err(error(format!("{}: more than one mmproj*.gguf projector", dir.display())));
            }
        } else if matches!(split_part(stem), None | Some((_, 1, _))) {
            check_parts(&file, stem)?;
            firsts.push(file);
        }
    }
    match firsts.len() {
        1 => Ok(ModelEntry {
            name: name.to_owned(),
            aliases: Vec::new(),
            path: firsts.remove(0),
            projector,
            settings: ModelSettings::default(),
        }),
        0 => Err(error(format!("{}: no model (*.gguf) in the folder", dir.display()))),
        n => Err(error(format!("{}: {n} models in one folder; a folder holds one model", dir.display()))),
    }
}

/// A folder's entries, by name.
fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, CatalogError> {
    let read = std::fs::read_dir(dir).map_err(|e| error(format!("{}: {e}", dir.display())))?;
    let mut entries = read
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| error(format!("{}: {e}", dir.display())))?;
    entries.sort();
    Ok(entries)
}

#[cfg(test)]
mod tests;
