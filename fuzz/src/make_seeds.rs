//! Writes the seed corpora of the fuzz targets: `make_seeds <corpus dir>`
//! (fuzz/seed.sh runs it). Seeds follow the input formats documented at the
//! top of each target.

use std::fs;
use std::path::{Path, PathBuf};

use llamacpp::{AddBos, Batch, Logits, builtin_chat_templates};
use llama_fuzz::{TINY_SPEC, ctx_params, repo_root, synthetic, tiny_model, vocab_paths};

const TEXTS: &[&str] = &[
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "  multiple   spaces\n\n\ttabs\r\n 1234567890 3.14159 -42",
    "héllo wörld – 日本語 한국어 Ελληνικά 🦙🦀 \u{200b}zero-width",
    "fn main() { println!(\"hi {}\", 1 + 2); } // <s></s><|endoftext|><|im_start|>user<|im_end|>",
];

const GRAMMARS: &[(&str, &str)] = &[
    ("root ::= \"yes\" | \"no\"", "yes"),
    ("root ::= [a-z]+ \" \" [0-9]{1,3}", "hello 42"),
    ("root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+ | \"(\" expr \")\"", "(1+2)-3"),
    (
        "root ::= object\nvalue ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n\
object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n\
array ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n\
string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n\
number ::= (\"-\"? ([0-9] | [1-9] [0-9]*)) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)? ws\nws ::= [ \\t\\n]*",
        "{\"a\": [1, 2.5, true, null], \"b\": \"x\\u0041\"}",
    ),
    ("root ::= (\"a\" | [^a\\n])* \"\\n\"? | <[1]> [^x]*", "abc\n"),
    ("root ::= line+\nline ::= \"- \" [A-Za-z ]{0,20} \"\\n\"", "- item one\n- two\n"),
];

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join(name), bytes).unwrap();
}

fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.join(&0u8)
}

fn main() {
    let out = PathBuf::from(std::env::args_os().nth(1).expect("usage: make_seeds <corpus dir>"));

    // gguf_load: the tiny synthetic model itself (seed.sh adds vocab files).
    let dir = out.join("gguf_load");
    fs::create_dir_all(&dir).unwrap();
    synthetic::write_tiny_llama(&dir.join("tiny-llama.gguf"), &TINY_SPEC).unwrap();
    let one_layer = synthetic::TinyModelSpec { n_embd: 8, n_head: 1, n_head_kv: 1, n_ff: 8, ..TINY_SPEC };
    synthetic::write_tiny_llama(&dir.join("tiny-llama-8.gguf"), &one_layer).unwrap();

    // tokenize: every fixture with a few texts and flag combinations.
    let dir = out.join("tokenize");
    for i in 0..vocab_paths().len() {
        for (j, t) in TEXTS.iter().enumerate() {
            let head = (i as u8) | ((j as u8 & 7) << 5);
            write(&dir, &format!("v{i:02}-t{j}"), &[&[head][..], t.as_bytes()].concat());
        }
    }

    // grammar and grammar_lazy.
    let dir = out.join("grammar");
    let lazy = out.join("grammar_lazy");
    for (i, (g, t)) in GRAMMARS.iter().enumerate() {
        write(&dir, &format!("g{i}"), &[&[0x40][..], &join(&[g.as_bytes(), t.as_bytes()])].concat());
        write(&dir, &format!("g{i}-dist"), &[&[0x42][..], &join(&[g.as_bytes(), t.as_bytes()])].concat());
        let patterns = format!("[\\s\\S]*?(<tool>)\n^{}", regex_escape(&t[..t.len().min(3)]));
        let text = format!("some words <tool>{t}");
        write(
            &lazy,
            &format!("l{i}"),
            &[&[0x40][..], &join(&[g.as_bytes(), patterns.as_bytes(), text.as_bytes()])].concat(),
        );
        let tok = 300i32.to_le_bytes();
        write(&lazy, &format!("l{i}-tok"), &[&[0x42][..], &join(&[g.as_bytes(), b"", t.as_bytes(), &tok])].concat());
    }
    write(&dir, "expr-root", &[&[0x41][..], &join(&[b"expr ::= [0-9]+ (\"*\" expr)?", b"12*3"])].concat());

    // chat_template: built-in names and the small Jinja templates.
    let dir = out.join("chat_template");
    for (i, name) in builtin_chat_templates().iter().enumerate() {
        write(&dir, &format!("builtin-{i:02}"), &[&[0x07][..], name.as_bytes()].concat());
    }
    let templates = repo_root().join("vendor/llama.cpp/models/templates");
    if let Ok(entries) = fs::read_dir(&templates) {
        let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for p in files.iter().filter(|p| p.extension().is_some_and(|e| e == "jinja")) {
            let Ok(body) = fs::read(p) else { continue };
            if body.len() > 4000 {
                continue;
            }
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            write(&dir, &format!("jinja-{name}"), &[&[0x09][..], &body].concat());
        }
    }

    // state_load: real states of the contexts the target loads into.
    let dir = out.join("state_load");
    let model = tiny_model();
    let prompt = model.vocab().tokenize("Hello world, the tiny model", AddBos::Yes).unwrap();
    let mut one = model.new_context(&ctx_params(1)).unwrap();
    one.decode(&Batch::from_tokens(&prompt, 0)).unwrap();
    write(&dir, "whole-1seq", &[&[0u8][..], &one.save_state().unwrap()].concat());
    write(&dir, "seq0-1seq", &[&[2u8][..], &one.save_seq_state(0).unwrap()].concat());
    let mut two = model.new_context(&ctx_params(2)).unwrap();
    let mut batch = Batch::new(64, 1);
    batch.push_sequence(&prompt, 0, 0, Logits::No).unwrap();
    batch.push_sequence(&prompt[..3], 0, 1, Logits::Yes).unwrap();
    two.decode(&batch).unwrap();
    write(&dir, "whole-2seq", &[&[1u8][..], &two.save_state().unwrap()].concat());
    write(&dir, "seq0-2seq", &[&[3u8][..], &two.save_seq_state(0).unwrap()].concat());
    write(&dir, "seq1-2seq", &[&[7u8][..], &two.save_seq_state(1).unwrap()].concat());
    eprintln!("seeds written to {}", out.display());
}

fn regex_escape(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_string() } else { format!("\\{c}") }).collect()
}
