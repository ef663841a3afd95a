//! Linux CPU lists (`0-15,32-47`), the format of sysfs `local_cpulist` and of the
//! `CPU Affinity` column of `nvidia-smi topo -m`.

/// Parses a CPU list into sorted, de-duplicated CPU numbers; `None` for `N/A` or malformed text.
pub fn parse(list: &str) -> Option<Vec<u32>> {
    let list = list.trim();
    if list.is_empty() || list.eq_ignore_ascii_case("N/A") {
        return None;
    }
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let part = part.trim();
        match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi): (u32, u32) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
                if hi < lo || hi - lo > 1 << 16 {
                    return None;
                }
                cpus.extend(lo..=hi);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// Formats CPU numbers as a compact list: `[0, 1, 2, 5]` -> `0-2,5`.
pub fn format(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        out.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
        i += 1;
    }
    out.join(",")
}

/// Expands an NVML affinity bitmask (`words[0]` bit 0 = CPU 0, `bits` bits per word) into CPU numbers.
pub fn from_bitmask(words: &[u64], bits: u32) -> Vec<u32> {
    let mut cpus = Vec::new();
    for (w, word) in words.iter().enumerate() {
        for bit in 0..bits.min(64) {
            if word >> bit & 1 == 1 {
                cpus.push(w as u32 * bits + bit);
            }
        }
    }
    cpus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats() {
        assert_eq!(parse("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse("N/A"), None);
        assert_eq!(parse("3-1"), None);
        assert_eq!(parse("a-b"), None);
        assert_eq!(format(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(parse("48-63,176-191").map(|c| c.len()), Some(32));
    }

    #[test]
    fn bitmask() {
        assert_eq!(from_bitmask(&[0b1011, 1], 64), vec![0, 1, 3, 64]);
        assert_eq!(from_bitmask(&[0xffff_0000], 32), (16..32).collect::<Vec<_>>());
    }
}
