//! Checks a projector file's metadata before libmtmd reads it.
//!
//! clip's loader (tools/mtmd/clip.cpp, `get_bool` … `get_string`) reads
//! each scalar key with `gguf_get_val_<type>`, which asserts that the
//! stored type is exactly the one asked for: a projector whose
//! `clip.vision.image_size` is an `int32` instead of a `uint32` aborts the
//! process. Arrays are safe (clip checks their types and throws), and so
//! are missing keys and tensors (it throws too). This module holds the
//! type clip reads every scalar key as, at the pinned llama.cpp, and
//! refuses a file that stores one of them as anything else. A unit test
//! derives the same table from the pinned clip.cpp and clip-impl.h, so a
//! new pin that reads another key fails there first.

use std::ffi::CStr;

use crate::llama::gguf::Gguf;
use crate::sys;
use crate::sys::gguf_type::{self, Type};

/// How clip reads a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Read {
    Bool,
    I32,
    U32,
    F32,
    Str,
}

impl Read {
    fn gguf_type(self) -> Type {
        match self {
            Read::Bool => gguf_type::GGUF_TYPE_BOOL,
            Read::I32 => gguf_type::GGUF_TYPE_INT32,
            Read::U32 => gguf_type::GGUF_TYPE_UINT32,
            Read::F32 => gguf_type::GGUF_TYPE_FLOAT32,
            Read::Str => gguf_type::GGUF_TYPE_STRING,
        }
    }
}

/// The scalar keys clip reads by their full name (`KEY_*` of clip-impl.h).
pub(super) const SCALAR_KEYS: &[(&str, Read)] = &[
    ("clip.audio.chunk_size", Read::U32),
    ("clip.audio.conv_kernel_size", Read::U32),
    ("clip.audio.local_block_count", Read::U32),
    ("clip.audio.local_group_size", Read::U32),
    ("clip.audio.max_pos_emb", Read::U32),
    ("clip.audio.num_mel_bins", Read::U32),
    ("clip.audio.projector.downsample_rate", Read::U32),
    ("clip.audio.projector.head_count", Read::U32),
    ("clip.audio.projector.stack_factor", Read::U32),
    ("clip.audio.projector.window_size", Read::U32),
    ("clip.audio.projector_type", Read::Str),
    ("clip.audio.rvq.num_quantizers", Read::U32),
    ("clip.audio.subsampling_factor", Read::U32),
    ("clip.audio.window_size", Read::U32),
    ("clip.gen.audio.model_variant", Read::Str),
    ("clip.gen.audio.projector_type", Read::Str),
    ("clip.has_audio_encoder", Read::Bool),
    ("clip.has_gen_audio_encoder", Read::Bool),
    ("clip.has_vision_encoder", Read::Bool),
    ("clip.minicpmv_query_num", Read::U32),
    ("clip.minicpmv_version", Read::I32),
    ("clip.projector_type", Read::Str),
    ("clip.use_gelu", Read::Bool),
    ("clip.use_silu", Read::Bool),
    ("clip.vision.expert_used_count", Read::U32),
    ("clip.vision.image_max_pixels", Read::U32),
    ("clip.vision.image_min_pixels", Read::U32),
    ("clip.vision.image_size", Read::U32),
    ("clip.vision.mm_patch_merge_type", Read::Str),
    ("clip.vision.n_wa_pattern", Read::U32),
    ("clip.vision.patch_size", Read::U32),
    ("clip.vision.preproc_image_size", Read::U32),
    ("clip.vision.preproc_max_tiles", Read::U32),
    ("clip.vision.preproc_min_tiles", Read::U32),
    ("clip.vision.projector.query_side", Read::U32),
    ("clip.vision.projector.scale_factor", Read::U32),
    ("clip.vision.projector.window_side", Read::U32),
    ("clip.vision.projector_type", Read::Str),
    ("clip.vision.sam.block_count", Read::U32),
    ("clip.vision.sam.embedding_length", Read::U32),
    ("clip.vision.sam.head_count", Read::U32),
    ("clip.vision.spatial_merge_size", Read::U32),
    ("clip.vision.swiglu_clamp", Read::F32),
    ("clip.vision.window_size", Read::U32),
    ("general.description", Read::Str),
    ("general.name", Read::Str),
];

/// The scalar keys clip reads once per encoder, `clip.<encoder>.<key>`
/// (`string_format(KEY_*, prefix)`).
pub(super) const ENCODER_KEYS: &[(&str, Read)] = &[
    ("attention.head_count", Read::U32),
    ("attention.head_count_kv", Read::U32),
    ("attention.head_dim", Read::U32),
    ("attention.layer_norm_epsilon", Read::F32),
    ("block_count", Read::U32),
    ("embedding_length", Read::U32),
    ("feed_forward_length", Read::U32),
    ("projection_dim", Read::U32),
];

/// The encoders whose keys are prefixed (clip's `prefix`): images, audio
/// in, and the audio-generation encoder (`clip.has_gen_audio_encoder`).
pub(super) const ENCODERS: [&str; 3] = ["vision", "audio", "gen.audio"];

/// Every scalar key clip reads, with how it reads it.
fn expected() -> impl Iterator<Item = (String, Read)> {
    let plain = SCALAR_KEYS.iter().map(|&(key, read)| (key.to_owned(), read));
    let per_encoder = ENCODERS
        .iter()
        .flat_map(|encoder| ENCODER_KEYS.iter().map(move |&(key, read)| (format!("clip.{encoder}.{key}"), read)));
    plain.chain(per_encoder)
}

/// The name of a GGUF type, for messages.
fn type_name(t: Type) -> &'static str {
    match t {
        gguf_type::GGUF_TYPE_UINT8 => "uint8",
        gguf_type::GGUF_TYPE_INT8 => "int8",
        gguf_type::GGUF_TYPE_UINT16 => "uint16",
        gguf_type::GGUF_TYPE_INT16 => "int16",
        gguf_type::GGUF_TYPE_UINT32 => "uint32",
        gguf_type::GGUF_TYPE_INT32 => "int32",
        gguf_type::GGUF_TYPE_FLOAT32 => "float32",
        gguf_type::GGUF_TYPE_BOOL => "bool",
        gguf_type::GGUF_TYPE_STRING => "string",
        gguf_type::GGUF_TYPE_ARRAY => "array",
        gguf_type::GGUF_TYPE_UINT64 => "uint64",
        gguf_type::GGUF_TYPE_INT64 => "int64",
        gguf_type::GGUF_TYPE_FLOAT64 => "float64",
        _ => "unknown",
    }
}

/// Checks the projector file `path`: `Err` with the reason for a file
/// ggml's parser rejects or a key stored with another type than clip
/// reads it as.
pub(super) fn check(path: &CStr) -> Result<(), String> {
    crate::llama::backend::clear_last_error();
    let Some(gguf) = Gguf::open(path) else {
        return Err(crate::llama::backend::last_error_or("not a valid GGUF file"));
    };
    for (key, read) in expected() {
        let Some((id, stored)) = gguf.find(&key) else { continue };
        let wanted = read.gguf_type();
        if stored == wanted {
            continue;
        }
        // ggml reads a one-element array of the right type as its value.
        let one_element = stored == gguf_type::GGUF_TYPE_ARRAY && {
            // SAFETY: `id` is a valid key id of this context, of an array
            // (its type is checked just above).
            let (elem, n) = unsafe { (sys::gguf_get_arr_type(gguf.ptr(), id), sys::gguf_get_arr_n(gguf.ptr(), id)) };
            elem == wanted && n == 1
        };
        if !one_element {
            return Err(format!(
                "metadata key `{key}` is stored as {}, but libmtmd reads it as {} (it would abort)",
                type_name(stored),
                type_name(wanted)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use super::*;

    /// clip's scalar reads, derived from the pinned source: each call
    /// `get_<type>(KEY_X, …)` or `get_<type>(string_format(KEY_X, prefix), …)`.
    fn derived_from_source() -> (BTreeMap<String, Read>, BTreeMap<String, Read>) {
        assert!(!crate::sys::SOURCE_DIR.is_empty(), "the feature mtmd builds from the pinned llama.cpp tree");
        let dir = Path::new(crate::sys::SOURCE_DIR).join("tools/mtmd");
        let clip = std::fs::read_to_string(dir.join("clip.cpp")).unwrap();
        let header = std::fs::read_to_string(dir.join("clip-impl.h")).unwrap();
        let defines: BTreeMap<&str, &str> = header
            .lines()
            .filter_map(|line| {
                let rest = line.trim().strip_prefix("#define KEY_")?;
                let (name, value) = rest.split_once(char::is_whitespace)?;
                let value = value.trim().strip_prefix('"')?.split('"').next()?;
                Some((name, value))
            })
            .collect();
        let (mut plain, mut per_encoder) = (BTreeMap::new(), BTreeMap::new());
        for (call, read) in
            [("bool", Read::Bool), ("i32", Read::I32), ("u32", Read::U32), ("f32", Read::F32), ("string", Read::Str)]
        {
            let pattern = format!("get_{call}(");
            for (at, _) in clip.match_indices(&pattern) {
                let before = clip[..at].chars().next_back();
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                    continue; // gguf_get_val_u32( and the like
                }
                let arg = clip[at + pattern.len()..].split(',').next().unwrap().trim();
                if arg.starts_with("const std::string") {
                    continue; // the definition
                }
                let (name, prefixed) = match arg.strip_prefix("string_format(KEY_") {
                    Some(name) => (name, true),
                    None => {
                        (arg.strip_prefix("KEY_").unwrap_or_else(|| panic!("clip reads `{arg}`: not a KEY_")), false)
                    }
                };
                let value = defines[name];
                let (table, key) = if prefixed {
                    (&mut per_encoder, value.strip_prefix("clip.%s.").unwrap().to_owned())
                } else {
                    (&mut plain, value.to_owned())
                };
                if let Some(other) = table.insert(key.clone(), read) {
                    assert_eq!(other, read, "clip reads {key} as two types");
                }
            }
        }
        (plain, per_encoder)
    }

    /// The encoder prefixes clip formats its keys with: the strings of its
    /// `const char * prefix = is_vision ? …` line and the literal prefixes of
    /// `string_format(KEY_*, "…")` calls.
    fn prefixes_from_source() -> std::collections::BTreeSet<String> {
        let clip = std::fs::read_to_string(Path::new(crate::sys::SOURCE_DIR).join("tools/mtmd/clip.cpp")).unwrap();
        let quoted = |text: &str| -> Vec<String> { text.split('"').skip(1).step_by(2).map(str::to_owned).collect() };
        // (Another `prefix` names tensors: "v" or "a".)
        let lines: Vec<&str> =
            clip.lines().filter(|l| l.contains("const char * prefix =") && l.contains("\"vision\"")).collect();
        assert_eq!(lines.len(), 1, "clip.cpp's prefix line: {lines:?}");
        let mut prefixes: std::collections::BTreeSet<String> = quoted(lines[0]).into_iter().collect();
        for (at, _) in clip.match_indices("string_format(KEY_") {
            let args = clip[at..].split(')').next().unwrap();
            if let Some((_, second)) = args.split_once(',') {
                prefixes.extend(quoted(second));
            }
        }
        prefixes
    }

    /// `check` on a file of nothing but the metadata `set` writes.
    #[cfg(feature = "testing")]
    fn check_metadata(set: impl FnOnce(&mut crate::testing::GgufWriter) -> std::io::Result<()>) -> Result<(), String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.gguf");
        let mut w = crate::testing::GgufWriter::for_tensors(&[]).unwrap();
        w.set_str("general.architecture", "clip").unwrap();
        set(&mut w).unwrap();
        w.write(&path).unwrap();
        check(&std::ffi::CString::new(path.to_str().unwrap()).unwrap())
    }

    #[cfg(feature = "testing")]
    #[test]
    fn keys_of_each_encoder_are_checked_and_one_element_arrays_pass() {
        for encoder in ENCODERS {
            let key = format!("clip.{encoder}.embedding_length");
            let err = check_metadata(|w| w.set_f32(&key, 1152.0)).unwrap_err();
            assert!(err.contains(&key) && err.contains("float32") && err.contains("uint32"), "{err}");
            assert_eq!(check_metadata(|w| w.set_u32(&key, 1152)), Ok(()));
        }
        // ggml reads a one-element array of the right type as its value;
        // any other array aborts.
        let eps = "clip.gen.audio.attention.layer_norm_epsilon";
        assert_eq!(check_metadata(|w| w.set_arr_f32(eps, &[1e-5])), Ok(()));
        let err = check_metadata(|w| w.set_arr_f32(eps, &[1e-5, 1e-6])).unwrap_err();
        assert!(err.contains("array"), "{err}");
        assert!(check_metadata(|w| w.set_arr_f32(eps, &[])).is_err());
        assert!(check_metadata(|w| w.set_arr_i32("clip.vision.image_size", &[896])).is_err());
        assert_eq!(check_metadata(|w| w.set_str("clip.projector_type", "gemma3")), Ok(()));
    }

    #[test]
    fn the_key_table_is_clips_at_the_pinned_commit() {
        let ours: std::collections::BTreeSet<String> = ENCODERS.iter().map(|&e| e.to_owned()).collect();
        assert_eq!(ours, prefixes_from_source());
        let (plain, per_encoder) = derived_from_source();
        let ours = |table: &[(&str, Read)]| table.iter().map(|&(k, r)| (k.to_owned(), r)).collect::<BTreeMap<_, _>>();
        assert_eq!(ours(SCALAR_KEYS), plain);
        assert_eq!(ours(ENCODER_KEYS), per_encoder);
        assert!(plain.len() > 40 && per_encoder.len() == 8, "{} and {}", plain.len(), per_encoder.len());
    }
}
