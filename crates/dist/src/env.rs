//! Which worker this process is: torchrun's variables (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
//! `MASTER_ADDR`, `MASTER_PORT`, as `torch.distributed.run` sets them), else SLURM's (`srun` sets
//! `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_JOB_NODELIST`), else a single process.
//!
//! [`super::launcher`] sets the torchrun variables, so a launched worker and a torchrun worker look
//! the same.

/// The port of the rendezvous store when SLURM gives none (`torch.distributed`'s default).
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// Where the worker environment came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvSource {
    /// `RANK`/`WORLD_SIZE`/… set by dpo-train's own launcher (which also names its flight
    /// records' directory, [`super::flight::DIR_VAR`]).
    Launcher,
    /// `RANK`/`WORLD_SIZE`/… set by another (torchrun, or by hand).
    Torchrun,
    /// `SLURM_PROCID`/`SLURM_NTASKS`/… (one `srun` task per GPU).
    Slurm,
    /// None of them: one process, rank 0 of 1.
    Single,
}

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEnv {
    /// Global rank in `0..world_size`.
    pub rank: usize,
    /// Rank on this node: the CUDA device to use.
    pub local_rank: usize,
    /// Processes in the job.
    pub world_size: usize,
    /// Host of rank 0, which serves the rendezvous store.
    pub master_addr: String,
    /// Port of the rendezvous store.
    pub master_port: u16,
    pub source: EnvSource,
}

impl WorkerEnv {
    /// The environment of a lone process.
    pub fn single() -> Self {
        Self {
            rank: 0,
            local_rank: 0,
            world_size: 1,
            master_addr: "127.0.0.1".to_string(),
            master_port: DEFAULT_MASTER_PORT,
            source: EnvSource::Single,
        }
    }

    /// Whether this process is one of several.
    pub fn is_distributed(&self) -> bool {
        self.world_size > 1
    }
}

/// A switch variable's setting: `1` on, `0` off, `None` where unset or empty.
pub fn switch(var: &'static str) -> Result<Option<bool>, EnvError> {
    dpo_base::env::switch(var).map_err(|e| EnvError::Invalid { var, value: e.value, expected: dpo_base::env::SWITCH })
}

/// A worker variable that is missing or malformed.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("`{var}` is not set, but `{because}` is")]
    Missing { var: &'static str, because: &'static str },
    #[error("`{var}` is `{value}`, not a {expected}")]
    Invalid { var: &'static str, value: String, expected: &'static str },
    #[error("`{rank_var}` is {rank}, not below `{world_var}` = {world_size}")]
    RankOutOfRange { rank_var: &'static str, rank: usize, world_var: &'static str, world_size: usize },
    #[error("`{var}` is `{value}`: no host name in it")]
    BadNodelist { var: &'static str, value: String },
}

/// Reads the worker environment of this process (see the module docs for the order).
pub fn detect() -> Result<WorkerEnv, EnvError> {
    detect_from(|name| std::env::var(name).ok())
}

/// [`detect`] over any variable lookup (tests pass a map).
pub fn detect_from(get: impl Fn(&str) -> Option<String>) -> Result<WorkerEnv, EnvError> {
    if get("RANK").is_some() || get("WORLD_SIZE").is_some() {
        let because = if get("RANK").is_some() { "RANK" } else { "WORLD_SIZE" };
        let need = |var: &'static str| get(var).ok_or(EnvError::Missing { var, because });
        let rank = parse_usize("RANK", &need("RANK")?)?;
        let world_size = parse_world("WORLD_SIZE", &need("WORLD_SIZE")?)?;
        let local_rank = parse_usize("LOCAL_RANK", &need("LOCAL_RANK")?)?;
        let master_addr = need("MASTER_ADDR")?;
        let master_port = parse_port("MASTER_PORT", &need("MASTER_PORT")?)?;
        check_rank("RANK", rank, "WORLD_SIZE", world_size)?;
        let source = if get(super::flight::DIR_VAR).is_some() { EnvSource::Launcher } else { EnvSource::Torchrun };
        return Ok(WorkerEnv { rank, local_rank, world_size, master_addr, master_port, source });
    }
    if let Some(procid) = get("SLURM_PROCID") {
        let because = "SLURM_PROCID";
        let need = |var: &'static str| get(var).ok_or(EnvError::Missing { var, because });
        let rank = parse_usize("SLURM_PROCID", &procid)?;
        let world_size = parse_world("SLURM_NTASKS", &need("SLURM_NTASKS")?)?;
        let local_rank = parse_usize("SLURM_LOCALID", &need("SLURM_LOCALID")?)?;
        check_rank("SLURM_PROCID", rank, "SLURM_NTASKS", world_size)?;
        let master_addr = match get("MASTER_ADDR") {
            Some(addr) => addr,
            None => {
                let (var, list) = match get("SLURM_JOB_NODELIST") {
                    Some(list) => ("SLURM_JOB_NODELIST", list),
                    None => ("SLURM_NODELIST", need("SLURM_NODELIST")?),
                };
                first_host(&list).ok_or(EnvError::BadNodelist { var, value: list.clone() })?
            }
        };
        let master_port = match get("MASTER_PORT") {
            Some(port) => parse_port("MASTER_PORT", &port)?,
            None => DEFAULT_MASTER_PORT,
        };
        return Ok(WorkerEnv { rank, local_rank, world_size, master_addr, master_port, source: EnvSource::Slurm });
    }
    Ok(WorkerEnv::single())
}

fn parse_usize(var: &'static str, value: &str) -> Result<usize, EnvError> {
    value.trim().parse().map_err(|_| EnvError::Invalid {
        var,
        value: value.to_string(),
        expected: "non-negative integer",
    })
}

fn parse_world(var: &'static str, value: &str) -> Result<usize, EnvError> {
    match parse_usize(var, value) {
        Ok(0) | Err(_) => Err(EnvError::Invalid { var, value: value.to_string(), expected: "positive integer" }),
        Ok(n) => Ok(n),
    }
}

fn parse_port(var: &'static str, value: &str) -> Result<u16, EnvError> {
    match value.trim().parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => Err(EnvError::Invalid { var, value: value.to_string(), expected: "TCP port (1-65535)" }),
    }
}

fn check_rank(rank_var: &'static str, rank: usize, world_var: &'static str, world_size: usize) -> Result<(), EnvError> {
    if rank < world_size { Ok(()) } else { Err(EnvError::RankOutOfRange { rank_var, rank, world_var, world_size }) }
}

/// The first host of a SLURM node list in its compressed syntax: `gpu[01-04,07],login1` → `gpu01`,
/// `rack[2-3]-n[08-09]` → `rack2-n08`, `node7` → `node7`. Zero padding is kept as written, as
/// `scontrol show hostnames` does. `None` for an empty or malformed list.
pub fn first_host(nodelist: &str) -> Option<String> {
    let mut host = String::new();
    let mut chars = nodelist.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            ',' => break,
            '[' => {
                // The first item of the range list: up to the first `-`, `,` or `]`.
                let mut first = String::new();
                let mut closed = false;
                for c in chars.by_ref() {
                    if c == ']' {
                        closed = true;
                        break;
                    }
                    first.push(c);
                }
                let first = first.split([',', '-']).next().unwrap_or_default();
                if !closed || first.is_empty() || !first.chars().all(|c| c.is_ascii_digit()) {
                    return None;
                }
                host.push_str(first);
            }
            ']' => return None,
            c if c.is_whitespace() => return None,
            c => host.push(c),
        }
    }
    if host.is_empty() { None } else { Some(host) }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn detect_with(vars: &[(&str, &str)]) -> Result<WorkerEnv, EnvError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        detect_from(|name| map.get(name).cloned())
    }

    #[test]
    fn first_host_of_compressed_nodelists() {
        assert_eq!(first_host("gpu[01-04,07],login1").as_deref(), Some("gpu01"));
        assert_eq!(first_host("gpu[07,01-04]").as_deref(), Some("gpu07"));
        assert_eq!(first_host("node7").as_deref(), Some("node7"));
        assert_eq!(first_host("login1,gpu[01-02]").as_deref(), Some("login1"));
        assert_eq!(first_host("rack[2-3]-n[08-09]").as_deref(), Some("rack2-n08"));
        assert_eq!(first_host("nid[00012-00020]").as_deref(), Some("nid00012"));
        assert_eq!(first_host(""), None);
        assert_eq!(first_host("gpu[01-04"), None);
        assert_eq!(first_host("gpu[]"), None);
        assert_eq!(first_host("gpu]"), None);
    }

    #[test]
    fn torchrun_variables() {
        let env = detect_with(&[
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.0.0.2"),
            ("MASTER_PORT", "29501"),
            ("SLURM_PROCID", "0"),
        ])
        .unwrap();
        assert_eq!(
            env,
            WorkerEnv {
                rank: 3,
                local_rank: 1,
                world_size: 4,
                master_addr: "10.0.0.2".into(),
                master_port: 29501,
                source: EnvSource::Torchrun
            }
        );
        assert!(env.is_distributed());
    }

    #[test]
    fn slurm_variables_and_nodelist_fallbacks() {
        let base = [("SLURM_PROCID", "5"), ("SLURM_NTASKS", "8"), ("SLURM_LOCALID", "1")];
        let env = detect_with(&[&base[..], &[("SLURM_JOB_NODELIST", "gpu[03-04]")]].concat()).unwrap();
        assert_eq!((env.rank, env.local_rank, env.world_size), (5, 1, 8));
        assert_eq!((env.master_addr.as_str(), env.master_port, env.source), ("gpu03", 29500, EnvSource::Slurm));
        let env = detect_with(&[&base[..], &[("SLURM_NODELIST", "a1,b2")]].concat()).unwrap();
        assert_eq!(env.master_addr, "a1");
        let env = detect_with(
            &[&base[..], &[("MASTER_ADDR", "head"), ("MASTER_PORT", "1234"), ("SLURM_NODELIST", "x")]].concat(),
        )
        .unwrap();
        assert_eq!((env.master_addr.as_str(), env.master_port), ("head", 1234));
    }

    #[test]
    fn single_process_without_variables() {
        assert_eq!(detect_with(&[]).unwrap(), WorkerEnv::single());
    }

    #[test]
    fn errors_name_the_variable() {
        let err = detect_with(&[("RANK", "0"), ("WORLD_SIZE", "2")]).unwrap_err();
        assert_eq!(err.to_string(), "`LOCAL_RANK` is not set, but `RANK` is");
        let err = detect_with(&[("WORLD_SIZE", "2")]).unwrap_err();
        assert_eq!(err.to_string(), "`RANK` is not set, but `WORLD_SIZE` is");
        let torchrun = [("LOCAL_RANK", "0"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")];
        let err = detect_with(&[&torchrun[..], &[("RANK", "x"), ("WORLD_SIZE", "2")]].concat()).unwrap_err();
        assert_eq!(err.to_string(), "`RANK` is `x`, not a non-negative integer");
        let err = detect_with(&[&torchrun[..], &[("RANK", "2"), ("WORLD_SIZE", "2")]].concat()).unwrap_err();
        assert_eq!(err.to_string(), "`RANK` is 2, not below `WORLD_SIZE` = 2");
        let err = detect_with(&[&torchrun[..], &[("RANK", "0"), ("WORLD_SIZE", "0")]].concat()).unwrap_err();
        assert_eq!(err.to_string(), "`WORLD_SIZE` is `0`, not a positive integer");
        let err = detect_with(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("LOCAL_RANK", "0"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "70000"),
        ])
        .unwrap_err();
        assert_eq!(err.to_string(), "`MASTER_PORT` is `70000`, not a TCP port (1-65535)");
        let slurm = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_LOCALID", "0")];
        let err = detect_with(&slurm).unwrap_err();
        assert_eq!(err.to_string(), "`SLURM_NODELIST` is not set, but `SLURM_PROCID` is");
        let err = detect_with(&[&slurm[..], &[("SLURM_JOB_NODELIST", "gpu[01")]].concat()).unwrap_err();
        assert_eq!(err.to_string(), "`SLURM_JOB_NODELIST` is `gpu[01`: no host name in it");
    }
}
