//! Run reports: the metrics CSV, PNG plots and sample generations.
