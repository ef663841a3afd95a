//! The configuration reference, `docs/configuration.md`, rendered from the key table: every key
//! with its flag, type, default and meaning, then TRL's keys that dpo-train accepts without
//! effect or refuses, with the reason. `make config-reference` writes the file; a test fails when
//! the committed one is stale.

use crate::keys::Section;
use crate::trl::{TRL_KEYS, Treatment};
use crate::{KEYS, TrainConfig};

/// The reference as Markdown.
pub fn markdown() -> String {
    let toml::Value::Table(defaults) = toml::Value::try_from(TrainConfig::default()).expect("the defaults serialise")
    else {
        unreachable!("a struct serialises to a table")
    };
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from dpo-train's key table (`crates/config/src/lib.rs`) by `make config-reference`;\n\
         a test fails when this file is stale. Every key goes in a TOML or YAML file (`--config FILE`) or on\n\
         the command line as its flag; a flag overrides the file, and an unset key takes TRL 1.16's\n\
         `DPOConfig` default where TRL has the key. `dpo-train eval` takes the loss keys as flags.\n\n\
         - [Training keys](#training-keys)\n- [Loss keys](#loss-keys)\n- [TRL keys without a key here](#trl-keys-without-a-key-here)\n",
    );
    for (section, title) in [(Section::Run, "Training keys"), (Section::Loss, "Loss keys")] {
        out += &format!("\n## {title}\n\n| key | flag | type | default | meaning |\n|---|---|---|---|---|\n");
        for key in KEYS.iter().filter(|k| k.section == section) {
            let default = defaults.get(key.name).map_or_else(|| "unset".to_owned(), |v| format!("`{v}`"));
            let doc = key.doc.trim().replace('|', "\\|");
            out +=
                &format!("| `{}` | `{}` | {} | {default} | {doc} |\n", key.name, dpo_vocab::flag(key.name), key.kind);
        }
    }
    out += "\n## TRL keys without a key here\n\n\
            A config or command line written for TRL may set them (as flags too: `--eval_strategy no`,\n\
            `--use_peft`): each is accepted where its value changes nothing here or is another name\n\
            for one of the keys above, and refused by name with the reason otherwise.\n\n\
            | TRL key | accepted | otherwise |\n|---|---|---|\n";
    for (name, treatment) in TRL_KEYS {
        let (accepted, otherwise) = match treatment {
            Treatment::Inert => ("any value (changes nothing here)".to_owned(), String::new()),
            Treatment::Only(values, why) => {
                (values.iter().map(|v| format!("`{v}`")).collect::<Vec<_>>().join(", "), why.to_string())
            }
            Treatment::Never(why) => ("never".to_owned(), why.to_string()),
            Treatment::Rename(ours) => (format!("any value: it is `{ours}`"), String::new()),
            Treatment::Means(_, what) => (what.to_string(), "refused".to_owned()),
            Treatment::InertWithout(other, why) => {
                (format!("any value without `{other}` (changes nothing here)"), format!("beside `{other}`: {why}"))
            }
        };
        out += &format!("| `{name}` | {accepted} | {} |\n", otherwise.replace('|', "\\|"));
    }
    out
}

#[cfg(test)]
mod tests {
    /// `docs/configuration.md` is the key table's: regenerate it with `make config-reference`
    /// (`DPO_TRAIN_WRITE_REFERENCE=1` makes this test write it).
    #[test]
    fn the_configuration_reference_is_current() {
        let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md"));
        let want = super::markdown();
        if std::env::var_os("DPO_TRAIN_WRITE_REFERENCE").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(have == want, "{} is stale: run `make config-reference`", path.display());
    }
}
