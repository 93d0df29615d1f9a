//! Offload by default: the layer count [`GpuLayers`] resolves to before
//! llama.cpp loads a model.

use std::path::Path;

use super::params::{GpuLayers, ModelParams};
use super::remote::Remote;
use crate::error::{Error, Result};
use crate::llama::backend::{self, Device, DeviceKind};
use crate::llama::plan::{self, MemoryBudget};

/// `params.gpu_layers` as llama.cpp's `n_gpu_layers` (negative: all),
/// fitting the model at `paths` where it asks for a fit.
pub(super) fn n_gpu_layers(paths: &[&Path], params: &ModelParams) -> Result<i32> {
    let budget = match &params.gpu_layers {
        GpuLayers::All => return Ok(-1),
        GpuLayers::Count(n) => return Ok(i32::try_from(*n).unwrap_or(i32::MAX)),
        GpuLayers::Within(budget) => budget.clone(),
        GpuLayers::Fit => {
            let devices = offload_devices(params)?;
            if devices.is_empty() {
                // A CPU-only build without RPC servers: nothing to plan.
                return Ok(0);
            }
            free_budget(&devices, params.fit_margin)
        }
    };
    // The plans' loads must not fit again.
    let counted = params.clone().gpu_layers(GpuLayers::Count(0));
    let strict = matches!(params.gpu_layers, GpuLayers::Within(_));
    match plan::fit_layers(paths, &counted, &params.fit_context, &budget, strict) {
        Ok(fit) => {
            let all = if fit.capped { " (every layer)" } else { "" };
            log::info!("offloading {} layers{all}: what fits {budget:?}", fit.n_gpu_layers);
            Ok(fit.n_gpu_layers)
        }
        Err(e @ Error::DoesNotFit { .. }) if !strict => {
            log::warn!("no layer offloaded: {e}");
            Ok(0)
        }
        Err(e) => Err(e),
    }
}

/// The devices other than the CPU that a load with `params` would put
/// layers on: those `params.devices` names, or the RPC servers' and the
/// local GPUs, or (llama.cpp's choice without a list) the local GPUs, and
/// the integrated ones where there is no discrete GPU.
fn offload_devices(params: &ModelParams) -> Result<Vec<Device>> {
    let offloads = |d: &Device| !matches!(d.kind, DeviceKind::Cpu | DeviceKind::Accelerator);
    if let Some(list) = &params.devices {
        return Ok(list.iter().filter(|d| offloads(d)).cloned().collect());
    }
    if !params.rpc_servers.is_empty() {
        // The workers' devices with their free memory (the lease ends
        // here; the load connects again).
        let (devices, _lease) = Remote::prepare(params)?;
        return Ok(devices.unwrap_or_default().into_iter().filter(offloads).collect());
    }
    let all = backend::devices();
    let gpus: Vec<Device> = all.iter().filter(|d| d.kind == DeviceKind::Gpu).cloned().collect();
    if !gpus.is_empty() {
        return Ok(gpus);
    }
    Ok(all.into_iter().filter(|d| d.kind == DeviceKind::IntegratedGpu).collect())
}

/// Each device's free memory less `margin`.
pub(crate) fn free_budget(devices: &[Device], margin: u64) -> MemoryBudget {
    devices.iter().fold(MemoryBudget::default(), |budget, d| {
        budget.device(&d.name, (d.memory_free as u64).saturating_sub(margin))
    })
}
