//! Topology analysis shared by the live probe and offline input: NVLink islands (connected
//! components over `NV#` links) and NUMA groups, in `nvidia-smi topo -m` vocabulary.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::snapshot::{Link, Snapshot};

/// GPUs sharing one NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaGroup {
    /// `None` when the node is unknown.
    pub node: Option<u32>,
    pub gpus: Vec<u32>,
}

/// What the planner and the renderer need to know about the layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// NVLink-connected groups of two or more GPUs.
    pub nvlink_islands: Vec<Vec<u32>>,
    pub numa_groups: Vec<NumaGroup>,
    /// Whether the links between the GPUs are known (`--topo`, or a probe that read them): where
    /// they are not, `nvlink_islands` is empty for want of knowing, not for want of NVLink.
    #[serde(default = "known")]
    pub links_known: bool,
}

fn known() -> bool {
    true
}

/// Connected components of `among` over NVLink edges, largest first, each sorted.
pub fn nvlink_islands(snap: &Snapshot, among: &[u32]) -> Vec<Vec<u32>> {
    let mut seen = vec![false; among.len()];
    let mut islands = Vec::new();
    for start in 0..among.len() {
        if seen[start] {
            continue;
        }
        seen[start] = true;
        let mut stack = vec![start];
        let mut island = Vec::new();
        while let Some(i) = stack.pop() {
            island.push(among[i]);
            for j in 0..among.len() {
                if !seen[j] && matches!(snap.link(among[i], among[j]), Link::NvLink(n) if n > 0) {
                    seen[j] = true;
                    stack.push(j);
                }
            }
        }
        if island.len() > 1 {
            island.sort_unstable();
            islands.push(island);
        }
    }
    islands.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
    islands
}

/// GPUs of `among` grouped by NUMA node, in node order (unknown last).
pub fn numa_groups(snap: &Snapshot, among: &[u32]) -> Vec<NumaGroup> {
    let mut by_node: BTreeMap<Option<u32>, Vec<u32>> = BTreeMap::new();
    for &i in among {
        by_node.entry(snap.gpu(i).and_then(|g| g.numa_node)).or_default().push(i);
    }
    let mut groups: Vec<NumaGroup> = by_node.into_iter().map(|(node, gpus)| NumaGroup { node, gpus }).collect();
    groups.sort_by_key(|g| (g.node.is_none(), g.node));
    groups
}

/// Islands and NUMA groups over every GPU of the snapshot.
pub fn analyze(snap: &Snapshot) -> Topology {
    let all: Vec<u32> = snap.gpus.iter().map(|g| g.index).collect();
    let links_known = all.len() < 2 || snap.pairs.iter().any(|p| p.link != Link::Unknown);
    Topology { nvlink_islands: nvlink_islands(snap, &all), numa_groups: numa_groups(snap, &all), links_known }
}

/// The weakest link inside a set of GPUs (`X` for one GPU).
pub fn weakest_link(snap: &Snapshot, gpus: &[u32]) -> Link {
    let mut worst = Link::SelfLink;
    for (k, &a) in gpus.iter().enumerate() {
        for &b in &gpus[k + 1..] {
            let l = snap.link(a, b);
            if l.rank() < worst.rank() {
                worst = l;
            }
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{Gpu, Pair, Source};

    fn snap(links: &[(u32, u32, Link)], numa: &[Option<u32>]) -> Snapshot {
        let mut s = Snapshot::new(Source::NvidiaSmi);
        s.gpus =
            numa.iter().enumerate().map(|(i, n)| Gpu { index: i as u32, numa_node: *n, ..Gpu::default() }).collect();
        s.pairs = links
            .iter()
            .map(|&(a, b, link)| Pair { a, b, link, nvlinks: None, p2p_read: None, p2p_write: None, p2p_nvlink: None })
            .collect();
        s
    }

    #[test]
    fn bridged_pairs_make_two_islands() {
        let s = snap(
            &[
                (0, 1, Link::NvLink(12)),
                (0, 2, Link::Sys),
                (0, 3, Link::Sys),
                (1, 2, Link::Sys),
                (1, 3, Link::Sys),
                (2, 3, Link::NvLink(12)),
            ],
            &[Some(0), Some(0), Some(1), Some(1)],
        );
        let t = analyze(&s);
        assert_eq!(t.nvlink_islands, vec![vec![0, 1], vec![2, 3]]);
        assert_eq!(
            t.numa_groups,
            vec![NumaGroup { node: Some(0), gpus: vec![0, 1] }, NumaGroup { node: Some(1), gpus: vec![2, 3] }]
        );
        assert_eq!(weakest_link(&s, &[0, 1]), Link::NvLink(12));
        assert_eq!(weakest_link(&s, &[0, 1, 2]), Link::Sys);
    }

    #[test]
    fn unknown_numa_sorts_last() {
        let s = snap(&[(0, 1, Link::Phb)], &[None, Some(3)]);
        let t = analyze(&s);
        assert!(t.nvlink_islands.is_empty());
        assert_eq!(t.numa_groups[0].node, Some(3));
        assert_eq!(t.numa_groups[1].node, None);
    }
}
