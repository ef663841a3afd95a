//! How numbers are shown: memory sizes, parameter counts and GPU lists.

/// `81.0 GiB`, `512 MiB`.
pub fn bytes(b: u64) -> String {
    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    let g = b as f64 / GIB;
    if g >= 1.0 { format!("{g:.1} GiB") } else { format!("{} MiB", b / (1024 * 1024)) }
}

/// `1.50B`, `135M`, `12.0K`.
pub fn count(n: u64) -> String {
    let f = n as f64;
    if f >= 1e12 {
        format!("{:.2}T", f / 1e12)
    } else if f >= 1e9 {
        format!("{:.2}B", f / 1e9)
    } else if f >= 1e6 {
        format!("{:.0}M", f / 1e6)
    } else if f >= 1e3 {
        format!("{:.1}K", f / 1e3)
    } else {
        n.to_string()
    }
}

/// `0,1,2`.
pub fn list(gpus: &[u32]) -> String {
    gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}
