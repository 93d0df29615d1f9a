//! Fitting a context to a memory budget with llama.cpp's own plans.

use std::path::Path;

use super::{HOST, MemoryBreakdown, MemoryPlan, Planner};
use crate::error::{Error, Result};
use crate::llama::context::{ContextParams, KvType};
use crate::llama::model::ModelParams;

/// A memory budget: bytes per device ([`HOST`] for RAM) and/or in total.
/// Devices without a budget are not limited.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryBudget {
    devices: Vec<(String, u64)>,
    total: Option<u64>,
}

impl MemoryBudget {
    /// At most `bytes` over every device together.
    pub fn total(bytes: u64) -> MemoryBudget {
        MemoryBudget { devices: Vec::new(), total: Some(bytes) }
    }

    /// At most `bytes` of host memory (RAM): the budget of a CPU-only run.
    pub fn host(bytes: u64) -> MemoryBudget {
        MemoryBudget::default().device(HOST, bytes)
    }

    /// Adds (or replaces) a limit of `bytes` on device `name`, as
    /// [`BufferMemory::device`](super::BufferMemory::device) names it.
    #[must_use]
    pub fn device(mut self, name: &str, bytes: u64) -> MemoryBudget {
        self.devices.retain(|(d, _)| d != name);
        self.devices.push((name.to_owned(), bytes));
        self
    }

    /// The first limit `memory` exceeds: (device or `"total"`, bytes
    /// needed there, the limit).
    pub fn overrun(&self, memory: &MemoryBreakdown) -> Option<(String, u64, u64)> {
        let devices = memory.devices();
        for (name, limit) in &self.devices {
            let needed = devices.iter().find(|d| d.device == *name).map_or(0, |d| d.total());
            if needed > *limit {
                return Some((name.clone(), needed, *limit));
            }
        }
        match self.total {
            Some(limit) if memory.total() > limit => Some(("total".to_owned(), memory.total(), limit)),
            _ => None,
        }
    }

    /// Whether `memory` stays within every limit.
    pub fn allows(&self, memory: &MemoryBreakdown) -> bool {
        self.overrun(memory).is_none()
    }
}

impl std::str::FromStr for MemoryBudget {
    type Err = Error;

    /// A budget as command lines write it: `NAME=SIZE` pairs separated
    /// by commas, device names as the plan prints them (`CUDA0`, `RPC0`,
    /// [`HOST`] for RAM) and `total` for the sum, sizes as
    /// [`parse_size`](super::parse_size) reads them:
    /// `CUDA0=20GiB,Host=8GiB`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty string, a pair without `=`
    /// or a name, or a size `parse_size` refuses.
    fn from_str(s: &str) -> Result<MemoryBudget> {
        let mut budget = MemoryBudget::default();
        for pair in s.split(',') {
            let (name, size) = pair
                .split_once('=')
                .ok_or_else(|| Error::InvalidArgument(format!("`{}` is not NAME=SIZE", pair.trim())))?;
            let (name, bytes) = (name.trim(), super::parse_size(size)?);
            if name.is_empty() {
                return Err(Error::InvalidArgument(format!("`{}` names no device", pair.trim())));
            }
            budget = if name == "total" {
                MemoryBudget { total: Some(bytes), ..budget }
            } else {
                budget.device(name, bytes)
            };
        }
        Ok(budget)
    }
}

/// What to maximise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FitGoal {
    /// The largest `n_ctx` (a multiple of 256) for `n_seq` sequences, up to
    /// the training length per sequence (`n_ctx_train × n_seq`, rounded
    /// down to a multiple of 256; without `kv_unified` llama.cpp then pads
    /// each sequence's share up to 256).
    MaxContext {
        /// Sequences.
        n_seq: u32,
    },
    /// The most sequences (up to 256 and `n_batch`) with `n_ctx_seq` cells
    /// each (`n_ctx = n_ctx_seq × sequences`).
    MaxSequences {
        /// Cells per sequence.
        n_ctx_seq: u32,
    },
}

/// A configuration that fits.
#[derive(Clone, Debug)]
pub struct Fit {
    /// The parameters to create the context with.
    pub params: ContextParams,
    /// Their plan (within the budget).
    pub plan: MemoryPlan,
    /// The KV type chosen (of those offered to [`Planner::fit_kv`]).
    pub kv_type: KvType,
    /// The search stopped at its upper bound, not at the budget: a larger
    /// value might fit too. The bounds: `n_ctx_train × n_seq` cells
    /// (rounded down to 256) or `MAX_TOKENS`, for [`FitGoal::MaxContext`];
    /// 256 sequences, `n_batch`, or one sequence for an encoder-decoder
    /// model without `kv_unified`, for [`FitGoal::MaxSequences`].
    pub capped: bool,
}

impl Planner {
    /// The largest configuration of `goal` whose plan stays within
    /// `budget`, starting from `base` (its other settings, KV types
    /// included, are kept).
    ///
    /// Each step is one [`Planner::plan`]; the search doubles from the
    /// smallest step (256 cells, or one sequence) until a step does not
    /// fit, then bisects, over multiples of 256 cells (or sequence counts).
    /// The plan grows with the cells, so the answer's next step up does not
    /// fit unless [`Fit::capped`].
    ///
    /// # Errors
    /// [`Error::DoesNotFit`] when even the smallest configuration (256
    /// cells, or one sequence) exceeds the budget, naming the device and
    /// the part (weights alone, or weights + KV + compute) that does not
    /// fit; the errors of [`Planner::plan`].
    pub fn fit(&self, base: &ContextParams, budget: &MemoryBudget, goal: FitGoal) -> Result<Fit> {
        // An encoder-decoder model takes several sequences only in one
        // unified cache (see `Context::new`).
        let n_seq_cap = if self.model.has_encoder() && !base.kv_unified {
            1
        } else {
            crate::llama::context::max_sequences().min(base.n_batch).max(1)
        };
        let (configure, top): (Box<dyn Fn(u32) -> ContextParams>, u32) = match goal {
            FitGoal::MaxContext { n_seq } => {
                if n_seq == 0 {
                    return Err(Error::InvalidArgument("MaxContext needs at least one sequence".into()));
                }
                let train = u64::from(self.n_ctx_train().max(256)) * u64::from(n_seq);
                let limit = train.min(u64::from(crate::llama::context::MAX_TOKENS));
                let base = base.clone();
                (Box::new(move |k| base.clone().n_ctx(k * 256).n_seq_max(n_seq)), (limit / 256) as u32)
            }
            FitGoal::MaxSequences { n_ctx_seq } => {
                if n_ctx_seq == 0 {
                    return Err(Error::InvalidArgument("MaxSequences needs at least one cell per sequence".into()));
                }
                let base = base.clone();
                let most =
                    (u64::from(crate::llama::context::MAX_TOKENS) / u64::from(n_ctx_seq)).min(u64::from(n_seq_cap));
                (Box::new(move |k| base.clone().n_ctx(n_ctx_seq * k).n_seq_max(k)), most as u32)
            }
        };
        if top == 0 {
            return Err(Error::InvalidArgument(format!("{goal:?} leaves nothing to search")));
        }
        let try_k = |k: u32| -> Result<(ContextParams, MemoryPlan)> {
            let params = configure(k);
            let plan = self.plan(&params)?;
            Ok((params, plan))
        };
        let smallest = try_k(1)?;
        if let Some((device, needed, limit)) = budget.overrun(&smallest.1.memory) {
            return Err(does_not_fit(&smallest.1, &device, needed, limit));
        }
        // A larger step fits if its plan is within the budget; one that
        // llama.cpp refuses to create (it still allocates the cells'
        // bookkeeping, ~48 bytes each, for real) does not.
        let fits = |k: u32| -> Result<Option<(ContextParams, MemoryPlan)>> {
            match try_k(k) {
                Ok(c) if budget.allows(&c.1.memory) => Ok(Some(c)),
                Ok(_) | Err(Error::ContextCreate(_)) => Ok(None),
                Err(e) => Err(e),
            }
        };
        // Upwards by doubling from the smallest step, so that no plan is
        // tried at more than twice the answer; then bisection.
        // Invariant: `lo` fits; `hi` is the first step known not to (or
        // top + 1).
        let (mut lo, mut best) = (1u32, smallest);
        let mut hi = top + 1;
        let mut step = 2u32;
        while step <= top {
            match fits(step)? {
                Some(c) => (lo, best) = (step, c),
                None => {
                    hi = step;
                    break;
                }
            }
            step = step.saturating_mul(2);
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match fits(mid)? {
                Some(c) => (lo, best) = (mid, c),
                None => hi = mid,
            }
        }
        let kv_type = best.0.type_k;
        Ok(Fit { params: best.0, plan: best.1, kv_type, capped: lo == top })
    }

    /// [`Planner::fit`] with each KV type of `kv_types` in turn (both K
    /// and V; a quantized V cache needs flash attention, which `base`'s
    /// `Auto` gives on a CPU): the first type for which anything fits.
    ///
    /// # Errors
    /// As [`Planner::fit`], for the last type tried;
    /// [`Error::InvalidArgument`] for an empty list.
    pub fn fit_kv(
        &self,
        base: &ContextParams,
        budget: &MemoryBudget,
        goal: FitGoal,
        kv_types: &[KvType],
    ) -> Result<Fit> {
        let mut last = Err(Error::InvalidArgument("fit_kv needs at least one KV type".into()));
        for &kind in kv_types {
            last = self.fit(&base.clone().kv_type(kind), budget, goal);
            match &last {
                Err(Error::DoesNotFit { .. }) => continue,
                _ => return last,
            }
        }
        last
    }
}

/// The layer count that fits ([`Planner::fit_layers`]).
#[derive(Clone, Debug)]
pub struct LayerFit {
    /// Layers to offload ([`ModelParams::n_gpu_layers`]): the repeating
    /// layers in order, then the output layer (`n_layer + 1`: all).
    pub n_gpu_layers: i32,
    /// The plan with that many (within the budget).
    pub plan: MemoryPlan,
    /// Every layer fits: nothing is left on the host to offload.
    pub capped: bool,
}

impl Planner {
    /// The most layers of the model at `path` that go to its devices (the
    /// GPUs and RPC workers `model` names, or all that llama.cpp finds)
    /// with a context of `ctx` while the plan stays within `budget` on
    /// every budgeted device. Moving a layer to a device moves its
    /// weights, KV cells and share of the compute there, so the devices'
    /// memory only grows with the count: a search of at most
    /// `log2(n_layer + 2) + 2` plans, each a metadata-only load. The
    /// host's limit and the total in `budget` are checked at the answer.
    ///
    /// # Errors
    /// [`Error::DoesNotFit`] when no layer count keeps every device
    /// within its limit (naming it), or the answer's plan exceeds the
    /// host's limit or the total; [`Error::InvalidArgument`] for a limit on
    /// a device the model does not use (a misspelt name would otherwise
    /// limit nothing); the errors of [`Planner::new`] and
    /// [`Planner::plan`].
    pub fn fit_layers(
        path: impl AsRef<Path>,
        model: &ModelParams,
        ctx: &ContextParams,
        budget: &MemoryBudget,
    ) -> Result<LayerFit> {
        fit_layers(&[path.as_ref()], model, ctx, budget, true)
    }
}

/// [`Planner::fit_layers`] over a model's files; `strict`: a limit on a
/// device the model does not use is an error (else it is ignored, as for
/// the budget of every device found that offload by default builds).
pub(crate) fn fit_layers(
    paths: &[&Path],
    model: &ModelParams,
    ctx: &ContextParams,
    budget: &MemoryBudget,
    strict: bool,
) -> Result<LayerFit> {
    let planner = |layers: i32| Planner::from_paths(paths, &model.clone().n_gpu_layers(layers));
    let plan_with = |layers: i32| -> Result<MemoryPlan> { planner(layers)?.plan(ctx) };
    let devices_fit = |plan: &MemoryPlan| match budget.overrun(&plan.memory) {
        Some((device, ..)) => device == HOST || device == "total",
        None => true,
    };
    let first = planner(0)?;
    let none = first.plan(ctx)?;
    let top = first.model.n_layer() as i32 + 1;
    drop(first);
    if !devices_fit(&none) {
        let (device, needed, limit) = budget.overrun(&none.memory).expect("an overrun");
        return Err(does_not_fit(&none, &device, needed, limit));
    }
    let all = plan_with(top)?;
    // A limit on a device the model does not use would limit nothing.
    let known = all.memory.devices();
    if let Some((name, _)) =
        budget.devices.iter().find(|(name, _)| name != HOST && !known.iter().any(|d| d.device == *name))
        && strict
    {
        let names: Vec<&str> = known.iter().map(|d| d.device.as_str()).collect();
        return Err(Error::InvalidArgument(format!(
            "the budget names the device {name:?}, which this model does not use (its devices: {})",
            names.join(", ")
        )));
    }
    // Invariant: `lo` layers fit the devices; `hi` layers do not (or
    // `hi` is `top + 1`).
    let (mut lo, mut best, mut hi) = (0, none, top + 1);
    if devices_fit(&all) {
        (lo, best) = (top, all);
    } else {
        hi = top;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let plan = plan_with(mid)?;
        if devices_fit(&plan) {
            (lo, best) = (mid, plan);
        } else {
            hi = mid;
        }
    }
    if let Some((device, needed, limit)) = budget.overrun(&best.memory) {
        return Err(does_not_fit(&best, &device, needed, limit));
    }
    Ok(LayerFit { n_gpu_layers: lo, plan: best, capped: lo == top })
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn does_not_fit(plan: &MemoryPlan, device: &str, needed: u64, limit: u64) -> Error {
    let parts = if device == "total" {
        plan.memory.devices().into_iter().fold(super::BufferMemory::default_named("total"), |mut acc, d| {
            acc.weights += d.weights;
            acc.kv += d.kv;
            acc.compute += d.compute;
            acc
        })
    } else {
        plan.memory
            .devices()
            .into_iter()
            .find(|d| d.device == device)
            .unwrap_or_else(|| super::BufferMemory::default_named(device))
    };
    let detail = if parts.weights > limit {
        format!("the weights alone need {}", mib(parts.weights))
    } else {
        format!(
            "at the smallest configuration (n_ctx {}, {} sequence(s), KV {:?}) weights {} + KV {} + compute {} = {}",
            plan.n_ctx,
            plan.n_seq_max,
            plan.type_k,
            mib(parts.weights),
            mib(parts.kv),
            mib(parts.compute),
            mib(needed)
        )
    };
    Error::DoesNotFit {
        device: device.to_owned(),
        needed,
        budget: limit,
        detail: format!("{detail}, over {}", mib(limit)),
    }
}
