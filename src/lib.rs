//! dpo-train: Direct Preference Optimization on burn + libtorch.
