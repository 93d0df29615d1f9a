//! Samplers written in Rust in the chain, and their panics (in a call and
//! in a destructor) resumed in the caller.

use super::*;

/// Bans a set of tokens (logit -inf) and counts its calls.
#[derive(Clone)]
struct Ban {
    banned: Vec<Token>,
    accepted: Arc<Mutex<Vec<Token>>>,
    resets: Arc<AtomicUsize>,
    clones: Arc<AtomicUsize>,
}

impl CustomSampler for Ban {
    fn name(&self) -> &str {
        "ban"
    }
    fn apply(&mut self, candidates: &mut Candidates<'_>) {
        for c in candidates.data_mut() {
            if self.banned.contains(&Token(c.id)) {
                c.logit = f32::NEG_INFINITY;
            }
        }
    }
    fn accept(&mut self, token: Token) {
        self.accepted.lock().unwrap().push(token);
    }
    fn reset(&mut self) {
        self.resets.fetch_add(1, Ordering::SeqCst);
    }
    fn clone_sampler(&self) -> Box<dyn CustomSampler> {
        self.clones.fetch_add(1, Ordering::SeqCst);
        Box::new(self.clone())
    }
}

/// Selects the candidate with the smallest token id.
struct SmallestId;

impl CustomSampler for SmallestId {
    fn apply(&mut self, candidates: &mut Candidates<'_>) {
        let best = candidates.data().iter().enumerate().min_by_key(|(_, c)| c.id).map(|(i, _)| i);
        if let Some(i) = best {
            candidates.select(i).unwrap();
        }
        assert!(candidates.select(usize::MAX).is_err());
    }
    fn selects(&self) -> bool {
        true
    }
    fn clone_sampler(&self) -> Box<dyn CustomSampler> {
        Box::new(SmallestId)
    }
}

#[test]
fn custom_samplers_run_in_the_chain() {
    let model = tiny_model();
    let (mut ctx, n) = prompt_ctx(&model, "Hello world");
    let logits = ctx.logits(Output::Last).unwrap().to_vec();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let banned = vec![Token(order[0] as i32), Token(order[1] as i32)];
    let ban = Ban { banned: banned.clone(), accepted: Arc::default(), resets: Arc::default(), clones: Arc::default() };
    let mut s = SamplerChain::new().custom(ban.clone()).greedy().build().unwrap();
    let t = s.sample(&mut ctx, Output::Last).unwrap();
    assert_eq!(t, Token(order[2] as i32), "the best token that is not banned");
    assert_eq!(*ban.accepted.lock().unwrap(), [t]);
    s.reset();
    assert_eq!(ban.resets.load(Ordering::SeqCst), 1);
    let mut copy = s.try_clone().unwrap();
    assert_eq!(ban.clones.load(Ordering::SeqCst), 1);
    assert_eq!(copy.sample(&mut ctx, Output::Last).unwrap(), t);
    assert_eq!(ban.accepted.lock().unwrap().len(), 2, "the copy shares the Arc");

    // A custom selecting sampler may end a chain.
    assert!(SamplerChain::new().custom(ban.clone()).build().is_err(), "a non-selecting custom sampler cannot");
    let mut s = SamplerChain::new().top_k(10).custom(SmallestId).build().unwrap();
    let t = s.sample(&mut ctx, Output::Last).unwrap();
    assert_eq!(t.0 as usize, *order[..10].iter().min().unwrap());
    // Generating with the custom chain never yields a banned token.
    let mut s = SamplerChain::new().custom(ban).temp(2.0).dist(3).build().unwrap();
    let mut b = Batch::new(1, 1);
    ctx.clear_kv();
    decode_seq(&mut ctx, &tokens(model.vocab(), "Hello world"), 0, 0);
    for i in 0..40 {
        let t = s.sample(&mut ctx, Output::Last).unwrap();
        assert!(!banned.contains(&t));
        b.clear();
        b.push(t, n + i, &[0], Logits::Yes).unwrap();
        ctx.decode(&b).unwrap();
    }
}

/// Panics on demand in the chosen callback.
struct Panicky {
    armed: Arc<AtomicBool>,
    in_apply: bool,
}

impl CustomSampler for Panicky {
    fn apply(&mut self, _: &mut Candidates<'_>) {
        if self.in_apply && self.armed.load(Ordering::SeqCst) {
            panic!("boom in apply");
        }
    }
    fn accept(&mut self, token: Token) {
        if !self.in_apply && self.armed.load(Ordering::SeqCst) {
            std::panic::panic_any(format!("boom in accept {token}"));
        }
    }
    fn clone_sampler(&self) -> Box<dyn CustomSampler> {
        if self.armed.load(Ordering::SeqCst) {
            panic!("boom in clone");
        }
        Box::new(Panicky { armed: Arc::clone(&self.armed), in_apply: self.in_apply })
    }
}

fn message(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<&'static str>() {
        Ok(s) => (*s).to_owned(),
        Err(p) => *p.downcast::<String>().expect("a string payload"),
    }
}

#[test]
fn a_panic_in_a_custom_sampler_is_resumed_in_the_caller() {
    let model = tiny_model();
    let (mut ctx, _) = prompt_ctx(&model, "Hello world");
    let expected = Sampler::greedy().sample(&mut ctx, Output::Last).unwrap();
    for in_apply in [true, false] {
        let armed = Arc::new(AtomicBool::new(true));
        let mut s =
            SamplerChain::new().custom(Panicky { armed: Arc::clone(&armed), in_apply }).greedy().build().unwrap();
        let payload =
            catch_unwind(AssertUnwindSafe(|| s.sample(&mut ctx, Output::Last))).expect_err("the panic must reach us");
        let want = if in_apply { "boom in apply".to_owned() } else { format!("boom in accept {expected}") };
        assert_eq!(message(payload), want);
        // The clone callback too.
        let payload = catch_unwind(AssertUnwindSafe(|| s.try_clone().map(drop))).expect_err("clone panic");
        assert_eq!(message(payload), "boom in clone");
        // Disarmed, the same sampler keeps working.
        armed.store(false, Ordering::SeqCst);
        assert_eq!(s.sample(&mut ctx, Output::Last).unwrap(), expected);
        assert_eq!(s.try_clone().unwrap().sample(&mut ctx, Output::Last).unwrap(), expected);
    }
}

/// Panics in a custom sampler's destructor happen inside llama.cpp's
/// `llama_sampler_free`; they reach the code that dropped the sampler, and
/// while already unwinding they are dropped instead of aborting.
#[test]
fn a_panic_in_a_custom_sampler_destructor_is_resumed() {
    struct Bomb;
    impl CustomSampler for Bomb {
        fn apply(&mut self, _: &mut Candidates<'_>) {}
        fn clone_sampler(&self) -> Box<dyn CustomSampler> {
            Box::new(Bomb)
        }
    }
    impl Drop for Bomb {
        fn drop(&mut self) {
            if !std::thread::panicking() {
                panic!("bomb dropped");
            }
        }
    }
    let s = SamplerChain::new().custom(Bomb).greedy().build().unwrap();
    let payload = catch_unwind(AssertUnwindSafe(move || drop(s))).expect_err("the destructor's panic");
    assert_eq!(message(payload), "bomb dropped");
    // Dropped without building: the same.
    let chain = SamplerChain::new().custom(Bomb);
    let payload = catch_unwind(AssertUnwindSafe(move || drop(chain))).expect_err("the destructor's panic");
    assert_eq!(message(payload), "bomb dropped");
    // Dropped while a panic unwinds: the first panic wins, no abort.
    let payload = catch_unwind(AssertUnwindSafe(|| {
        let _s = SamplerChain::new().custom(Bomb).greedy().build().unwrap();
        panic!("first");
    }))
    .expect_err("the first panic");
    assert_eq!(message(payload), "first");
    // And nothing is left pending for the next, unrelated sampler.
    let model = tiny_model();
    let (mut ctx, _) = prompt_ctx(&model, "Hello world");
    Sampler::greedy().sample(&mut ctx, Output::Last).unwrap();
}
