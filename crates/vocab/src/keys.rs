//! The config keys check-gpu sets, by their names in dpo-train's key table (TRL's names where TRL
//! has the key), and the launcher's flags. dpo-train's tests check that each is a key of its table.

pub const MODEL_NAME_OR_PATH: &str = "model_name_or_path";
pub const TRAIN_FILE: &str = "train_file";
pub const PER_DEVICE_TRAIN_BATCH_SIZE: &str = "per_device_train_batch_size";
pub const GRADIENT_ACCUMULATION_STEPS: &str = "gradient_accumulation_steps";
pub const GLOBAL_BATCH_SIZE: &str = "global_batch_size";
pub const MAX_LENGTH: &str = "max_length";
pub const BF16: &str = "bf16";
pub const FP16: &str = "fp16";
pub const LORA_R: &str = "lora_r";
pub const LORA_TARGET_MODULES: &str = "lora_target_modules";
pub const PRECOMPUTE_REF_LOG_PROBS: &str = "precompute_ref_log_probs";
pub const GRADIENT_CHECKPOINTING: &str = "gradient_checkpointing";
pub const SHARDING: &str = "sharding";
pub const OFFLOAD_OPTIMIZER: &str = "offload_optimizer";
pub const LOSS_TYPE: &str = "loss_type";
pub const PROMPT_COLUMN: &str = "prompt_column";
pub const CHOSEN_COLUMN: &str = "chosen_column";
pub const REJECTED_COLUMN: &str = "rejected_column";
pub const DATASET_TRAIN_SPLIT: &str = "dataset_train_split";
pub const DATASET_CONFIG: &str = "dataset_config";
pub const UNPAIR: &str = "unpair";
pub const SKIP_BAD_ROWS: &str = "skip_bad_rows";
pub const TOKENIZER_NAME_OR_PATH: &str = "tokenizer_name_or_path";

/// The config keys above.
pub const CONFIG_KEYS: [&str; 23] = [
    MODEL_NAME_OR_PATH,
    TRAIN_FILE,
    PER_DEVICE_TRAIN_BATCH_SIZE,
    GRADIENT_ACCUMULATION_STEPS,
    GLOBAL_BATCH_SIZE,
    MAX_LENGTH,
    BF16,
    FP16,
    LORA_R,
    LORA_TARGET_MODULES,
    PRECOMPUTE_REF_LOG_PROBS,
    GRADIENT_CHECKPOINTING,
    SHARDING,
    OFFLOAD_OPTIMIZER,
    LOSS_TYPE,
    PROMPT_COLUMN,
    CHOSEN_COLUMN,
    REJECTED_COLUMN,
    DATASET_TRAIN_SPLIT,
    DATASET_CONFIG,
    UNPAIR,
    SKIP_BAD_ROWS,
    TOKENIZER_NAME_OR_PATH,
];

/// The `loss_type` values that train without a reference model (TRL's CPOTrainer and
/// ORPOTrainer losses): check-gpu plans no reference for them. dpo-train's tests check that these
/// are exactly its `LossType::is_reference_free` names.
pub const REFERENCE_FREE_LOSSES: [&str; 4] = ["cpo", "simpo", "alphapo", "orpo"];

/// KTO (TRL's KTOTrainer): it keeps its reference, and its KL estimate needs at least
/// [`KTO_MIN_MICRO_BATCH`] rows in a micro-batch.
pub const KTO: &str = "kto";
pub const KTO_MIN_MICRO_BATCH: u64 = 2;

/// KTOTrainer's losses (unpaired rows, a reference kept): `kto`, and `apo_zero_unpaired`, which
/// has no KL estimate and so no micro-batch minimum.
pub const UNPAIRED_LOSSES: [&str; 2] = [KTO, "apo_zero_unpaired"];

/// The launcher's GPU count or list (`--gpus 4`, `--gpus 0,2`, `--gpus auto`).
pub const GPUS: &str = "gpus";
/// The launcher's device list (`--devices cpu:4`).
pub const DEVICES: &str = "devices";
