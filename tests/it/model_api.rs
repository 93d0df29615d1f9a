//! Issue 3: the model-level API: hyper-parameters and metadata, loading
//! with progress and overrides, devices, tokenizing and detokenizing, chat
//! templates.

use std::panic::{AssertUnwindSafe, catch_unwind};

use llama_suite::safe_api::*;
use llama_suite::synthetic::{
    TINY_BOS_ID, TINY_CONTROL_TOKEN, TINY_CONTROL_TOKEN_ID, TINY_EOS_ID, TINY_FIRST_BYTE_ID, TINY_UNK_ID,
    TINY_VOCAB_SIZE, TinyModelSpec,
};
use llamacpp::{
    AddBos, ChatFormat, ChatMessage, Detokenizer, DeviceKind, Error, MetadataValue, Model, ModelParams, Special, Token,
    TokenAttrs, apply_builtin_template, builtin_chat_templates,
};

/// The parameter count of a tiny llama model, from its shapes.
fn tiny_params(spec: &TinyModelSpec) -> u64 {
    let (embd, ff, vocab) = (u64::from(spec.n_embd), u64::from(spec.n_ff), TINY_VOCAB_SIZE as u64);
    let kv = embd / u64::from(spec.n_head) * u64::from(spec.n_head_kv);
    let per_layer = 2 * embd // attention and FFN norms
        + 2 * embd * embd // q, o
        + 2 * embd * kv // k, v
        + 3 * embd * ff; // gate, up, down
    2 * vocab * embd + embd + u64::from(spec.n_layer) * per_layer // token_embd, output, output_norm
}

#[test]
fn hyper_parameters_and_metadata_match_the_spec() {
    let spec = TinyModelSpec::default();
    let model = tiny_model();
    assert_eq!(model.n_layer(), spec.n_layer as usize);
    assert_eq!(model.n_embd(), spec.n_embd as usize);
    assert_eq!(model.n_embd_out(), spec.n_embd as usize);
    assert_eq!(model.n_head(), spec.n_head as usize);
    assert_eq!(model.n_head_kv(), spec.n_head_kv as usize);
    assert_eq!(model.n_ctx_train(), spec.n_ctx_train);
    assert_eq!(model.n_swa(), 0);
    assert!(model.has_decoder() && !model.has_encoder());
    assert!(!model.is_recurrent() && !model.is_hybrid() && !model.is_diffusion());
    assert_eq!(model.decoder_start_token(), None);
    // Exact: every tensor is F32.
    assert_eq!(model.n_params(), tiny_params(&spec));
    assert_eq!(model.size(), 4 * tiny_params(&spec));
    let desc = model.description();
    assert!(desc.starts_with("llama ") && desc.contains("F32"), "{desc:?}");

    assert_eq!(model.metadata("general.architecture").as_deref(), Some("llama"));
    assert_eq!(model.metadata("llama.block_count").as_deref(), Some("2"));
    assert_eq!(model.metadata("llama.embedding_length").as_deref(), Some("64"));
    assert_eq!(model.metadata("no.such.key"), None);
    assert_eq!(model.metadata("bad\0key"), None);
    let entries = model.metadata_entries();
    assert!(entries.contains(&("general.architecture".into(), "llama".into())), "{entries:?}");
    assert!(entries.contains(&("llama.attention.head_count_kv".into(), "2".into())));
    assert!(entries.contains(&("tokenizer.ggml.bos_token_id".into(), "1".into())));
    assert!(entries.windows(2).all(|w| w[0].0 < w[1].0), "sorted, unique keys");
    // Arrays (the vocabulary) are left out by llama.cpp.
    assert!(!entries.iter().any(|(k, _)| k == "tokenizer.ggml.tokens"));
    assert_eq!(model.chat_template(None), None);
    // Without a template (and no built-in of the `llama` architecture's
    // name), llama.cpp's chatml is the fallback.
    assert!(matches!(model.chat_format(None).unwrap(), ChatFormat::Builtin(name) if name == "chatml"));
    assert_eq!(
        model.apply_chat_template(&[ChatMessage::user("hi")], true).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert!(matches!(model.chat_format(Some("tool_use")), Err(Error::ChatTemplate(_))));

    // Another shape, to be sure the numbers are read, not assumed.
    let other = other_tiny_model();
    assert_eq!((other.n_layer(), other.n_embd(), other.n_head(), other.n_head_kv()), (3, 32, 2, 1));
    assert_eq!(other.n_ctx_train(), 512);
    let spec = TinyModelSpec { n_layer: 3, n_embd: 32, n_head: 2, n_head_kv: 1, n_ff: 48, n_ctx_train: 512, seed: 7 };
    assert_eq!(other.n_params(), tiny_params(&spec));
}

#[test]
fn loading_reports_progress_and_can_be_cancelled() {
    let path = tiny_path();
    let mut seen = Vec::new();
    let model = Model::load_with_progress(&path, &ModelParams::default(), |p| {
        seen.push(p);
        true
    })
    .unwrap();
    assert!(!seen.is_empty());
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "not increasing: {seen:?}");
    assert!(seen.iter().all(|p| (0.0..=1.0).contains(p)), "{seen:?}");
    assert_eq!(seen.last(), Some(&1.0));
    drop(model);

    // Returning false cancels, at the first call or later.
    let r = Model::load_with_progress(&path, &ModelParams::default(), |_| false);
    assert!(matches!(r, Err(Error::LoadCancelled)), "{:?}", r.err());
    let mut calls = 0;
    let r = Model::load_with_progress(&path, &ModelParams::default(), |p| {
        calls += 1;
        p < 0.5
    });
    // A whole load reports 1.0 (checked above), so the callback says no
    // somewhere, after at least one call that said yes.
    assert!(matches!(r, Err(Error::LoadCancelled)), "{:?}", r.err());
    assert!(calls >= 2, "{calls} calls");

    // A panic in the callback cancels the load and reaches the caller.
    let payload = catch_unwind(AssertUnwindSafe(|| {
        Model::load_with_progress(&path, &ModelParams::default(), |_| panic!("progress exploded"))
    }))
    .expect_err("the panic must be resumed");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"progress exploded"));
    // Nothing is left in a bad state: loading works afterwards.
    Model::load(&path, &ModelParams::default()).unwrap();
}

#[test]
fn metadata_overrides_change_the_loaded_model() {
    let path = tiny_path();
    let params = ModelParams::default()
        .metadata_override("llama.context_length", MetadataValue::Int(4096))
        .metadata_override("tokenizer.ggml.add_bos_token", MetadataValue::Bool(false))
        .metadata_override("general.name", MetadataValue::Str("renamed".into()))
        .metadata_override("llama.attention.layer_norm_rms_epsilon", MetadataValue::Float(0.25));
    let model = Model::load(&path, &params).unwrap();
    // llama.cpp uses them ...
    assert_eq!(model.n_ctx_train(), 4096);
    assert!(!model.vocab().adds_bos());
    assert_ne!(model.vocab().tokenize("Hello", AddBos::Yes).unwrap()[0], Token(TINY_BOS_ID));
    // ... and metadata() reports them.
    assert_eq!(model.metadata("llama.context_length").as_deref(), Some("4096"));
    assert_eq!(model.metadata("tokenizer.ggml.add_bos_token").as_deref(), Some("false"));
    assert_eq!(model.metadata("general.name").as_deref(), Some("renamed"));
    assert_eq!(model.metadata("llama.attention.layer_norm_rms_epsilon").as_deref(), Some("0.250000"));
    let entries = model.metadata_entries();
    assert!(entries.contains(&("llama.context_length".into(), "4096".into())));
    assert!(entries.windows(2).all(|w| w[0].0 < w[1].0));
    // The epsilon really changed the network.
    let plain = tiny_model();
    let prompt = tokens(plain.vocab(), "Hello world");
    let mut a = plain.new_context(&small_params()).unwrap();
    let mut b = model.new_context(&small_params()).unwrap();
    assert!(nmse(&decode_seq(&mut a, &prompt, 0, 0), &decode_seq(&mut b, &prompt, 0, 0)) > 1e-6);
    // An override of a key the file does not have is added.
    let model =
        Model::load(&path, &ModelParams::default().metadata_override("x.custom", MetadataValue::Int(-3))).unwrap();
    assert_eq!(model.metadata("x.custom").as_deref(), Some("-3"));

    // Keys and strings must fit llama.cpp's 128-byte fields.
    let with =
        |key: String, value: MetadataValue| Model::load(&path, &ModelParams::default().metadata_override(key, value));
    assert!(matches!(with("k".repeat(128), MetadataValue::Int(1)), Err(Error::InvalidArgument(_))));
    assert!(matches!(with(String::new(), MetadataValue::Int(1)), Err(Error::InvalidArgument(_))));
    assert!(matches!(with("general.name".into(), MetadataValue::Str("n".repeat(128))), Err(Error::InvalidArgument(_))));
    with("k".repeat(127), MetadataValue::Int(1)).unwrap();
}

#[test]
fn devices_and_system_info() {
    let devices = llamacpp::devices();
    let cpu = devices.iter().find(|d| d.kind == DeviceKind::Cpu).expect("a CPU device");
    assert!(!cpu.name.is_empty());
    let info = llamacpp::system_info();
    assert!(info.contains("CPU"), "{info}");
    assert!(llamacpp::supports_mmap());
    assert_eq!(llamacpp::max_sequences(), 256);
    // ggml's clock, in microseconds: a 5 ms sleep advances it by 5000 or more.
    let t0 = llamacpp::time_us();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let t1 = llamacpp::time_us();
    assert!(t1 - t0 >= 5_000, "{t0} -> {t1}");
    // Loading on the CPU device only.
    let params = ModelParams::default().devices([cpu.clone()]);
    let model = Model::load(tiny_path(), &params).unwrap();
    assert_eq!(model.n_layer(), 2);
}

#[test]
fn unused_cpu_features_name_what_the_build_leaves_out() {
    let unused = llamacpp::unused_cpu_features();
    let info = llamacpp::system_info();
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        if cfg!(feature = "native") || !llamacpp::cpu_variants().is_empty() {
            // -march=native, or runtime dispatch to the best variant for
            // this CPU: everything it has.
            assert_eq!(unused, Vec::<&str>::new(), "{:?}: {info}", llamacpp::cpu_variant());
        } else if !cfg!(target_feature = "avx") {
            // One CPU backend for rustc's baseline x86-64 target
            // (LLAMA_SYS_CPU_VARIANTS=none): SSE only.
            for feature in ["AVX", "AVX2", "FMA", "F16C"] {
                assert!(unused.contains(&feature), "{feature} not in {unused:?}: {info}");
            }
        }
    }
    // Whatever is reported unused is absent from the system info.
    for feature in &unused {
        assert!(!info.split('|').any(|p| p.trim().ends_with(&format!(" {feature} = 1"))), "{feature}: {info}");
    }
}

#[test]
fn rpc_servers_and_tensor_split_are_checked() {
    // Port 1 on loopback: nothing listens there.
    let params = ModelParams::default().rpc_servers(["127.0.0.1:1"]);
    let err = Model::load(tiny_path(), &params).unwrap_err();
    if cfg!(feature = "rpc") {
        assert!(matches!(&err, Error::Rpc { endpoint, .. } if endpoint == "127.0.0.1:1"), "{err}");
    } else {
        assert!(matches!(&err, Error::Unsupported(m) if m.contains("`rpc` feature")), "{err}");
    }
    for split in [vec![-1.0], vec![0.0, 0.0], vec![f32::NAN], vec![1.0; 4096]] {
        let params = ModelParams::default().tensor_split(split.clone());
        let err = Model::load(tiny_path(), &params).unwrap_err();
        assert!(matches!(err, Error::InvalidParameter { name: "tensor_split", .. }), "{split:?}: {err:?}");
    }
    // A valid split of the CPU-only model changes nothing.
    let params = ModelParams::default().tensor_split([1.0, 3.0]);
    assert_eq!(Model::load(tiny_path(), &params).unwrap().n_layer(), 2);
}

#[test]
fn control_tokens_are_parsed_only_on_request() {
    let model = tiny_model();
    let vocab = model.vocab();
    let text = format!("a{TINY_CONTROL_TOKEN}b");
    let plain = vocab.tokenize(&text, AddBos::No).unwrap();
    assert!(!plain.contains(&Token(TINY_CONTROL_TOKEN_ID)), "{plain:?}");
    assert_eq!(vocab.detokenize(&plain, AddBos::No, Special::Plain).unwrap(), text);
    let special = vocab.tokenize_special(&text, AddBos::No).unwrap();
    assert!(special.contains(&Token(TINY_CONTROL_TOKEN_ID)), "{special:?}");
    // SentencePiece puts its space prefix on the text after a special token.
    assert_eq!(vocab.detokenize(&special, AddBos::No, Special::Plain).unwrap(), "a b");
    assert_eq!(vocab.detokenize(&special, AddBos::No, Special::Markup).unwrap(), format!("a{TINY_CONTROL_TOKEN} b"));
    assert_eq!(vocab.tokenize_special(TINY_CONTROL_TOKEN, AddBos::No).unwrap(), [Token(TINY_CONTROL_TOKEN_ID)]);

    // The vocabulary's own facts.
    assert_eq!(vocab.n_tokens(), TINY_VOCAB_SIZE);
    assert_eq!((vocab.bos(), vocab.eos()), (Some(Token(TINY_BOS_ID)), Some(Token(TINY_EOS_ID))));
    assert!(vocab.adds_bos() && !vocab.adds_eos());
    assert_eq!(vocab.tokenize("Hello", AddBos::Yes).unwrap()[0], Token(TINY_BOS_ID));
    assert!(vocab.is_eog(Token(TINY_EOS_ID)) && !vocab.is_eog(Token(300)));
    let ctrl = Token(TINY_CONTROL_TOKEN_ID);
    assert!(vocab.is_control(ctrl) && vocab.attrs(ctrl).unwrap().contains(TokenAttrs::CONTROL));
    assert_eq!(vocab.text(ctrl).unwrap(), TINY_CONTROL_TOKEN);
    assert!(vocab.attrs(Token(TINY_FIRST_BYTE_ID + 0x41)).unwrap().contains(TokenAttrs::BYTE));
    assert_eq!(vocab.text(Token(TINY_FIRST_BYTE_ID + 0x0a)).unwrap(), "<0x0A>");
    assert!(vocab.attrs(Token(TINY_UNK_ID)).unwrap().contains(TokenAttrs::UNKNOWN));
    assert!(vocab.score(Token(400)).unwrap() > vocab.score(Token(600)).unwrap(), "scores fall with the id");
    assert_eq!(vocab.token_to_piece(Token(TINY_BOS_ID), Special::Plain).unwrap(), b"");
    assert_eq!(vocab.token_to_piece(Token(TINY_BOS_ID), Special::Markup).unwrap(), b"<s>");
    let mut reused = Vec::with_capacity(64);
    vocab.tokenize_into("Hello world", AddBos::No, Special::Plain, &mut reused).unwrap();
    assert_eq!(reused.len(), 2);
    assert!(vocab.tokenize("", AddBos::No).unwrap().is_empty());
}

#[test]
fn the_detokenizer_never_splits_a_character() {
    let model = tiny_model();
    let vocab = model.vocab();
    for text in ["你好，世界！", "🦀🎉 emoji 👩‍👩‍👧", "Ünïcödé ñ €100 — ½ 𝄞", "mixed 日本語 and ascii", "a\nb\tc"]
    {
        let toks = vocab.tokenize(text, AddBos::No).unwrap();
        assert!(toks.len() > text.chars().count() / 2, "byte fallback gives many tokens for {text:?}");
        let mut d = Detokenizer::new(vocab, Special::Plain);
        let mut streamed = String::new();
        let mut held_back = 0;
        for &t in &toks {
            let piece = d.push_str(t).unwrap();
            assert!(!piece.contains('\u{fffd}'), "{text:?}: a broken character was emitted");
            if piece.is_empty() {
                held_back += 1;
            }
            streamed.push_str(&piece);
            assert!(d.pending().len() < 4, "at most an unfinished character is held back");
        }
        assert_eq!(d.finish(), "");
        // The SentencePiece space prefix of the first piece stays.
        assert_eq!(streamed.trim_start_matches(' '), text, "{toks:?}");
        if !text.is_ascii() {
            assert!(held_back > 0, "{text:?}: multi-byte characters arrive in several tokens");
        }
    }
    // Invalid UTF-8 becomes U+FFFD once, and the stream goes on.
    let mut d = Detokenizer::new(vocab, Special::Plain);
    let mut out = String::new();
    d.push(Token(TINY_FIRST_BYTE_ID + 0xe4), &mut out).unwrap(); // starts a 3-byte character
    assert_eq!(out, "");
    assert_eq!(d.pending(), [0xe4]);
    d.push(token_for_piece(vocab, "a"), &mut out).unwrap();
    assert_eq!(out, "\u{fffd}a");
    d.push(Token(TINY_FIRST_BYTE_ID + 0xf0), &mut out).unwrap();
    assert_eq!(d.finish(), "\u{fffd}", "an unfinished character is flushed as U+FFFD");
}

#[test]
fn chat_templates() {
    let names = builtin_chat_templates();
    assert!(names.contains(&"chatml") && names.contains(&"gemma") && names.contains(&"llama3"), "{names:?}");
    let chat = [ChatMessage::system("Be brief."), ChatMessage::user("Hi!"), ChatMessage::assistant("Hello.")];
    assert_eq!(
        apply_builtin_template("chatml", &chat, true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n\
         <|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(apply_builtin_template("chatml", &chat[1..2], false).unwrap(), "<|im_start|>user\nHi!<|im_end|>\n");
    assert_eq!(
        apply_builtin_template("gemma", &chat, true).unwrap(),
        "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
         <start_of_turn>model\n"
    );
    // A long conversation grows the buffer.
    let long: Vec<ChatMessage> =
        (0..200).map(|i| ChatMessage::user(format!("message {i} {}", "x".repeat(50)))).collect();
    let out = apply_builtin_template("chatml", &long, false).unwrap();
    assert_eq!(out.matches("<|im_start|>user").count(), 200);
    assert!(matches!(apply_builtin_template("no-such-template", &chat, true), Err(Error::ChatTemplate(_))));
    assert!(matches!(apply_builtin_template("chatml", &[ChatMessage::user("a\0b")], true), Err(Error::Nul(_))));
}

/// The cached Gemma 3 270M is the base model: its GGUF has no
/// `tokenizer.chat_template`, so its chat format falls back to llama.cpp's
/// built-in `gemma` (its architecture's family), which tokenizes with its
/// vocabulary into the real turn markers.
#[test]
fn gemma_chat_formatting() {
    let model = real_model();
    assert_eq!(model.metadata("general.architecture").as_deref(), Some("gemma3"));
    assert_eq!(model.chat_template(None), None);
    assert!(matches!(model.chat_format(None).unwrap(), ChatFormat::Builtin(name) if name == "gemma"));
    assert_eq!(
        model.apply_chat_template(&[ChatMessage::user("hi")], true).unwrap(),
        apply_builtin_template("gemma", &[ChatMessage::user("hi")], true).unwrap()
    );

    let out = apply_builtin_template("gemma", &[ChatMessage::user("What is 2+2?")], true).unwrap();
    assert!(out.contains("<start_of_turn>user\nWhat is 2+2?<end_of_turn>"), "{out:?}");
    // Its control tokens are parsed from the trusted template, not from user text.
    let vocab = model.vocab();
    let special = vocab.tokenize_special(&out, AddBos::Yes).unwrap();
    let plain = vocab.tokenize(&out, AddBos::Yes).unwrap();
    let start = vocab.tokenize_special("<start_of_turn>", AddBos::No).unwrap();
    assert_eq!(start.len(), 1);
    assert!(vocab.is_control(start[0]));
    assert_eq!(special.iter().filter(|&&t| t == start[0]).count(), 2);
    assert!(!plain.contains(&start[0]));
    assert!(plain.len() > special.len());
}

/// A template given as a metadata override is the model's template, and it
/// is run as Jinja (llama.cpp's matcher would have taken this text for
/// Gemma's format), with the vocabulary's BOS and EOS texts.
#[test]
fn a_chat_template_override_is_the_models_template() {
    let template =
        "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m.role }}:{{ m.content }}{% endfor %}{{ eos_token }}";
    assert!(template.len() < 128);
    let params =
        ModelParams::default().metadata_override("tokenizer.chat_template", MetadataValue::Str(template.into()));
    let model = Model::load(tiny_path(), &params).unwrap();
    assert_eq!(model.chat_template(None), Some(template));
    let format = model.chat_format(None).unwrap();
    assert!(
        matches!(&format, ChatFormat::Jinja { bos_token, eos_token, .. } if bos_token == "<s>" && eos_token == "</s>")
    );
    let chat = [ChatMessage::user("Hi"), ChatMessage::assistant("Yo")];
    assert_eq!(
        model.apply_chat_template(&chat, true).unwrap(),
        "<s><start_of_turn>user:Hi<start_of_turn>assistant:Yo</s>"
    );
    // Options override the vocabulary's texts; a built-in format refuses tools.
    let options = llamacpp::chat::RenderOptions::default().bos_token("[B]").eos_token("");
    assert_eq!(format.render(&chat[..1], &options).unwrap(), "[B]<start_of_turn>user:Hi");
    let builtin = ChatFormat::Builtin("chatml".into());
    let tools = llamacpp::chat::RenderOptions::default().tools(serde_json::json!([]));
    assert!(matches!(builtin.render(&chat, &tools), Err(Error::ChatTemplate(_))));
}

#[test]
fn small_model_and_library_facts() {
    let model = llama_suite::safe_api::tiny_model();
    assert_eq!(model.rope_type(), llamacpp::RopeType::Normal, "llama uses GPT-J style RoPE");
    assert_eq!(model.n_embd_inp(), model.n_embd());
    assert_eq!(model.n_layer_nextn(), 0);
    assert!(!model.vocab().adds_sep());
    assert!(llamacpp::version().starts_with("0."), "{}", llamacpp::version());

    let name = llamacpp::split_path("/models/m", 2, 4).unwrap();
    assert_eq!(name, "/models/m-00002-of-00004.gguf");
    assert_eq!(llamacpp::split_prefix(&name, 2, 4).as_deref(), Some("/models/m"));
    assert_eq!(llamacpp::split_prefix(&name, 3, 4), None);
    assert!(matches!(llamacpp::split_path("/models/m", 0, 4), Err(Error::InvalidArgument(_))));
    assert!(matches!(llamacpp::split_path("/models/m", 5, 4), Err(Error::InvalidArgument(_))));
}
