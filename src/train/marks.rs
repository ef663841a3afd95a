//! What a stage's loop measures besides its metrics, and the lines it prints of them at the
//! end: peak host and CUDA memory, the offloaded optimizer's copies, the token positions packing
//! avoided; and torch's profiler over the steps `DPO_TRAIN_PROFILE` names.

use dpo_torch::profiler::{ProfileWindow, Profiled};

use super::context::{Progress, Run};
use super::step::Trained;
use super::window::Positions;
use crate::data::Packing;

/// What a stage's loop measures besides its metrics: the high-water marks of host memory and (on
/// CUDA) of the CUDA allocator, both started here, and torch's profiler over the steps
/// `DPO_TRAIN_PROFILE` asks for (rank 0).
pub struct Marks {
    pub tracks_peak: bool,
    pub cuda: Option<usize>,
    profile: Option<ProfileWindow>,
}

impl Marks {
    pub fn start(run: &Run) -> anyhow::Result<Self> {
        let tracks_peak = crate::malloc::reset_peak_resident();
        let cuda = dpo_torch::allocator::cuda_index(&run.rt.device);
        if let Some(index) = cuda {
            dpo_torch::allocator::reset_peak_allocated(index)?;
        }
        let profile = match run.rt.workers.rank() {
            0 => ProfileWindow::from_env(cuda.is_some()).map_err(anyhow::Error::msg)?,
            _ => None,
        };
        Ok(Self { tracks_peak, cuda, profile })
    }

    pub fn before_step(&mut self, step: u64, progress: &mut dyn Progress) {
        self.profiled(progress, |p| p.before(step).map(|()| None));
    }

    pub fn after_step(&mut self, step: u64, end: bool, progress: &mut dyn Progress) {
        self.profiled(progress, |p| p.after(step, end));
    }

    /// A profiler that fails to start or to write its trace is a warning: the training goes on.
    fn profiled(
        &mut self,
        progress: &mut dyn Progress,
        f: impl FnOnce(&mut ProfileWindow) -> Result<Option<Profiled>, dpo_torch::TorchError>,
    ) {
        let Some(p) = self.profile.as_mut() else { return };
        match f(p) {
            Ok(Some(profiled)) => progress.line(&format!(
                "torch profiler trace written to `{}` ({} steps; host-device copies: {})",
                profiled.path.display(),
                profiled.steps,
                profiled.per_step()
            )),
            Ok(None) => {}
            Err(e) => {
                progress.line(&format!("warning: the torch profiler stopped ({e}); training goes on"));
                self.profile = None;
            }
        }
    }
}

/// Prints (rank 0) every rank's peak resident memory since the loop started: the model, optimizer
/// and activations of training, not the export after it. (Under dpo-train's allocator settings
/// freed memory stays resident, so the mark starts from what loading left resident; with
/// `MALLOC_MMAP_THRESHOLD_=65536`, as `make bench` runs, it follows the live tensors.) On CUDA
/// (`cuda`: this rank's device; every rank's is CUDA if one is) also the most the CUDA allocator
/// handed out, which is what `torch.cuda.max_memory_allocated` reports. Then each rank's largest
/// micro-batch (`largest`, [`super::window::Positions`]), the one its peak is likely to be from.
pub fn report_peak(
    run: &Run,
    name: &str,
    cuda: Option<usize>,
    largest: [usize; 2],
    progress: &mut dyn Progress,
) -> anyhow::Result<()> {
    let resident = crate::malloc::peak_resident().unwrap_or(0);
    let mut lines = vec![("peak resident memory while training", resident)];
    if let Some(index) = cuda {
        let peaks = dpo_torch::allocator::peaks(index)?;
        lines.push(("peak CUDA memory allocated while training", peaks.allocated));
        lines.push(("peak CUDA memory reserved while training", peaks.reserved));
    }
    let workers = run.rt.workers;
    for (what, bytes) in lines {
        let mut peaks = vec![0.0; workers.world_size()];
        peaks[workers.rank()] = bytes as f64;
        workers.sum_f64(&mut peaks)?;
        let gib: Vec<String> = peaks.iter().map(|b| format!("{:.2} GiB", b / f64::from(1u32 << 30))).collect();
        progress.line(&format!("{name}: {what}, per rank: {}", gib.join(", ")));
    }
    let mut counts = vec![0.0; 2 * workers.world_size()];
    counts[2 * workers.rank()..][..2].copy_from_slice(&largest.map(|c| c as f64));
    workers.sum_f64(&mut counts)?;
    let counts: Vec<String> = counts.chunks(2).map(|c| format!("{}/{}", c[0], c[1])).collect();
    progress.line(&format!(
        "{name}: largest micro-batch (token positions/scored predictions), per rank: {}",
        counts.join(", ")
    ));
    Ok(())
}

/// Prints (rank 0) what the offloaded optimizer's copies cost this rank a step, where it ran.
pub fn report_copies(trained: &Trained, name: &str, steps: u64, progress: &mut dyn Progress) {
    let Some(off) = trained.optimizer.masters.as_ref().filter(|m| steps > 0 && !m.resident) else { return };
    let (c, mib) = (off.copies, |b: u64| b as f64 / steps as f64 / f64::from(1u32 << 20));
    progress.line(&format!(
        "{name}: offloaded optimizer's copies, rank 0: {:.1} ms a step ({:.1} MiB to the host, {:.1} MiB back{})",
        1e3 * c.seconds / steps as f64,
        mib(c.to_host_bytes),
        mib(c.to_device_bytes),
        if off.pin { ", page-locked" } else { ", pageable" }
    ));
}

/// Prints (rank 0) how many token positions the forward passes computed over every rank, next to
/// what padded rows of the same sequences hold (`padding_free`, `prefix_sharing`).
pub fn report_positions(
    run: &Run,
    name: &str,
    mut p: Positions,
    packing: Packing,
    progress: &mut dyn Progress,
) -> anyhow::Result<()> {
    let mut sums = [p.computed, p.padded];
    run.rt.workers.sum_f64(&mut sums)?;
    [p.computed, p.padded] = sums;
    if p.padded > 0.0 {
        let few_shapes = match crate::dpo::shapes::pads(&run.rt.device) {
            true => "; each micro-batch padded to one of few lengths for the GPU's products",
            false => "",
        };
        progress.line(&format!(
            "{name}: computed {:.0} token positions where padded rows hold {:.0}: {:.1}% avoided ({}{few_shapes})",
            p.computed,
            p.padded,
            100.0 * p.avoided(),
            packing.describe()
        ));
    }
    Ok(())
}
