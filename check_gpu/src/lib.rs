//! check_gpu
