//! Per-token sampling cost with a JSON grammar vs without, on the default
//! model's (Gemma 3 270M Q4_K_M, or `LLAMA_MODEL`) 262,144-entry logits
//! row, threads from `LLAMA_BENCH_THREADS` (default 2):
//!
//! - `grammar/none`: a greedy chain, no grammar (the argmax shortcut);
//! - `grammar/json-object/masked/<state>`: a greedy chain behind
//!   [`llamacpp::json_schema::json_grammar`] built with `grammar_first(true)`,
//!   in a given parse state (after the text `<state>` was accepted): the
//!   grammar masks all 262,144 candidates, then greedy picks one;
//! - `grammar/json-object/checked/<state>`: the default chain: the argmax
//!   is checked against the grammar (one candidate), and only a refused one
//!   is picked again with the grammar masking (the logits row is the
//!   prompt's, so in some states the argmax is refused: both costs show);
//! - `grammar/schema/{masked,checked}/<state>`: the same with the grammar
//!   of a small schema (a bounded string, an integer range and an enum);
//! - `grammar/convert`: `schema_to_grammar` on that schema, plus llama.cpp
//!   parsing the grammar (`SamplerChain::grammar`);
//! - `grammar/guided/<schema>/<state>`: the same states constrained by
//!   llguidance (`SamplerChain::constraint`, always masked first), greedy;
//! - `grammar/random/{none,guided}/<state>`: a random chain (top-k 40,
//!   top-p 0.95, min-p 0.05, temperature 0.8) without and with the schema's
//!   llguidance constraint;
//! - `grammar/guided/alternatives-1900`: a Lark grammar of 1,900
//!   alternatives sharing a prefix, just inside llguidance's budget of
//!   2,000 Earley items per row, after that prefix;
//! - `grammar/guided-compile`: compiling the schema's constraint.
//!
//! Before criterion runs, the mask alone (`Sampler::constraint_mask_len`)
//! is timed at every token position of every valid document of the test
//! corpus (tests/it/json_schema/cases.rs), and its p50, p99 and maximum
//! are printed.
//!
//! Each iteration samples from a fresh clone of the sampler in its state
//! (cloning is not timed), so every measurement is of the same state.

use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use llama_suite::bench::{model, threads};
use llamacpp::constraint::{Constraint, JsonOptions};
use llamacpp::json_schema::{json_grammar, schema_to_grammar};
use llamacpp::{AddBos, Batch, Context, ContextParams, Output, Sampler, SamplerChain};
use serde_json::json;

/// A context whose last decode left the logits of a real prompt.
fn context() -> Context<'static> {
    let params = ContextParams::default().n_ctx(512).n_batch(512).n_threads(threads()).n_threads_batch(threads());
    let mut ctx = model().new_context(&params).expect("context");
    let tokens = model().vocab().tokenize("A person record in JSON:\n", AddBos::Yes).expect("tokenize");
    ctx.decode(&Batch::from_tokens(&tokens, 0)).expect("decode");
    ctx
}

fn schema() -> serde_json::Value {
    json!({"type": "object", "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "name": {"type": "string", "maxLength": 24},
        "role": {"enum": ["admin", "user", "guest"]}},
        "required": ["age", "name", "role"], "additionalProperties": false})
}

/// A greedy chain behind `gbnf` that has accepted the tokens of `prefix`;
/// `masked`: built with `grammar_first(true)` (the grammar masks every
/// candidate before each pick), else the default (the pick is checked
/// against the grammar first, and masked only if refused).
fn sampler_after(gbnf: &str, prefix: &str, masked: bool) -> Sampler<'static> {
    let vocab = model().vocab();
    let chain = SamplerChain::new().grammar_first(masked);
    let mut sampler = chain.grammar(vocab, gbnf, "root").greedy().build().expect("chain");
    for t in vocab.tokenize(prefix, AddBos::No).expect("tokenize") {
        sampler.accept(t).expect("the prefix fits the grammar");
    }
    sampler
}

#[allow(dead_code)]
#[path = "../tests/it/json_schema/cases.rs"]
mod cases;

/// The mask time at every token of every valid corpus document, with JSON
/// Schema's semantics and with the tight options: p50, p99, max.
fn mask_percentiles() {
    let start = std::time::Instant::now();
    SamplerChain::new().constraint(model(), &Constraint::regex("a")).greedy().build().expect("regex");
    eprintln!("the model's token table (built by the first constraint): {:?}", start.elapsed());
    for (name, options) in [("JSON Schema's semantics", JsonOptions::default()), ("tight", JsonOptions::tight())] {
        mask_percentiles_with(name, options);
    }
}

fn mask_percentiles_with(name: &str, options: JsonOptions) {
    let vocab = model().vocab();
    let mut times = Vec::new();
    for case in cases::cases() {
        {
            let constraint = Constraint::json_schema(case.schema.clone()).with_json_options(options);
            for doc in case.valid {
                let Ok(mut sampler) = SamplerChain::new().constraint(model(), &constraint).greedy().build() else {
                    continue;
                };
                let tokens = vocab.tokenize(doc, AddBos::No).expect("tokenize");
                for (at, &t) in tokens.iter().enumerate() {
                    let start = std::time::Instant::now();
                    let Ok(Some(allowed)) = sampler.constraint_mask_len() else { break };
                    let took = start.elapsed();
                    let prefix = vocab.detokenize(&tokens[..at], AddBos::No, llamacpp::Special::Plain).expect("text");
                    times.push((took, allowed, prefix));
                    if sampler.accept(t).is_err() {
                        break;
                    }
                }
            }
        }
    }
    times.sort_by_key(|t| t.0);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize].0;
    eprintln!(
        "constraint mask over the corpus, {name}: {} masks, p50 {:?}, p99 {:?}, max {:?}",
        times.len(),
        at(0.5),
        at(0.99),
        times.last().map(|t| t.0).unwrap_or_default()
    );
    for (took, allowed, prefix) in times.iter().rev().take(5) {
        eprintln!("  {took:?}: {allowed} tokens allowed after {prefix:?}");
    }
}

fn guided(c: &mut Criterion) {
    mask_percentiles();
    let mut group = c.benchmark_group("grammar");
    group.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    let mut ctx = context();
    let vocab = model().vocab();
    let states = ["", "{\"age\": 3", "{\"age\": 30, \"name\": \"Al"];
    let after = |chain: SamplerChain<'static>, state: &str| {
        let mut sampler = chain.build().expect("chain");
        for t in vocab.tokenize(state, AddBos::No).expect("tokenize") {
            sampler.accept(t).expect("the prefix fits");
        }
        sampler
    };
    let label = |state: &str| if state.is_empty() { "start".to_string() } else { format!("{state:?}") };
    let object = Constraint::json_schema(json!({"type": "object"}));
    let schema = Constraint::json_schema(schema()).with_json_options(JsonOptions::tight());
    for (name, constraint, states) in
        [("json-object", &object, ["", "{\"name\": \"Al", "{\"a\": [1, 2"]), ("schema", &schema, states)]
    {
        for state in states {
            let base = after(SamplerChain::new().constraint(model(), constraint).greedy(), state);
            group.bench_function(BenchmarkId::new(format!("guided/{name}"), label(state)), |b| {
                b.iter_batched(
                    || base.try_clone().expect("clone"),
                    |mut s| s.sample(&mut ctx, Output::Last).expect("sample"),
                    BatchSize::SmallInput,
                )
            });
        }
    }
    let random = |chain: SamplerChain<'static>| chain.top_k(40).top_p(0.95, 1).min_p(0.05, 1).temp(0.8).dist(1);
    for state in states {
        let plain = after(random(SamplerChain::new()), "");
        let constrained = after(random(SamplerChain::new().constraint(model(), &schema)), state);
        for (id, base) in [("random/none", plain), ("random/guided", constrained)] {
            group.bench_function(BenchmarkId::new(id, label(state)), |b| {
                b.iter_batched(
                    || base.try_clone().expect("clone"),
                    |mut s| s.sample(&mut ctx, Output::Last).expect("sample"),
                    BatchSize::SmallInput,
                )
            });
        }
    }
    // Just under llguidance's 2,000 items per row: the costliest mask its
    // budget lets through for this shape, after the shared prefix.
    let alternatives: Vec<String> = (0..1900).map(|i| format!("\"wqq{i:04}x\" e")).collect();
    let wide = Constraint::lark(format!("start: e\ne: {} | \"wqqend\"", alternatives.join(" | ")));
    let base = after(SamplerChain::new().constraint(model(), &wide).greedy(), "wqq");
    group.bench_function(BenchmarkId::new("guided/alternatives-1900", "\"wqq\""), |b| {
        b.iter_batched(
            || base.try_clone().expect("clone"),
            |mut s| s.sample(&mut ctx, Output::Last).expect("sample"),
            BatchSize::SmallInput,
        )
    });
    group.bench_function("guided-compile", |b| {
        b.iter(|| SamplerChain::new().constraint(model(), &schema).greedy().build().expect("chain"))
    });
    group.finish();
}

fn grammar(c: &mut Criterion) {
    let mut group = c.benchmark_group("grammar");
    group.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    let mut ctx = context();
    let mut greedy = Sampler::greedy();
    group.bench_function("none", |b| b.iter(|| greedy.sample(&mut ctx, Output::Last).expect("sample")));
    let schema_gbnf = schema_to_grammar(&schema()).expect("schema");
    for (name, gbnf, states) in [
        ("json-object", json_grammar(), ["", "{\"name\": \"Al", "{\"a\": [1, 2"]),
        ("schema", schema_gbnf.as_str(), ["", "{\"age\": 3", "{\"age\": 30, \"name\": \"Al"]),
    ] {
        for (masked, state) in [true, false].into_iter().flat_map(|f| states.map(|s| (f, s))) {
            let base = sampler_after(gbnf, state, masked);
            let label = if state.is_empty() { "start".to_string() } else { format!("{state:?}") };
            let id = format!("{name}/{}", if masked { "masked" } else { "checked" });
            group.bench_function(BenchmarkId::new(id, label), |b| {
                b.iter_batched(
                    || base.try_clone().expect("clone"),
                    |mut s| s.sample(&mut ctx, Output::Last).expect("sample"),
                    BatchSize::SmallInput,
                )
            });
        }
    }
    group.bench_function("convert", |b| {
        b.iter(|| {
            let gbnf = schema_to_grammar(&schema()).expect("schema");
            SamplerChain::new().grammar(model().vocab(), &gbnf, "root").greedy().build().expect("chain")
        })
    });
    group.finish();
}

criterion_group!(benches, guided, grammar);
criterion_main!(benches);
