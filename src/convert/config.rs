//! Edits of a draft's `config.json` that `convert` makes in every family: keys set, the
//! quantization lists renamed with the modules (ModelOpt's written again as `quantize`
//! writes them), `quantization_config` kept last, and the DFlash block size read.

use serde_json::{Map, Value};

/// A ModelOpt list exactly as `quantize --format modelopt` writes it (the module names, then
/// the names TensorRT-LLM gives them: `crate::quant::modelopt::exclude_modules`) is written
/// again from the renamed module names, so that it is the list `quantize` writes for the
/// converted draft; any other list is renamed entry by entry.
pub fn rename_quant_lists(q: &mut Value, rename: &dyn Fn(&str) -> String) {
    match q {
        Value::Object(m) => {
            for (k, v) in m.iter_mut() {
                if matches!(
                    k.as_str(),
                    "exclude" | "ignore" | "exclude_modules" | "modules_to_not_convert"
                ) {
                    if let Value::Array(a) = v {
                        if let Some(again) = modelopt_list_renamed(a, rename) {
                            *a = again;
                            continue;
                        }
                        for e in a.iter_mut() {
                            if let Some(s) = e.as_str().filter(|s| !s.starts_with("re:")) {
                                *e = Value::String(rename(s));
                            }
                        }
                    }
                } else {
                    rename_quant_lists(v, rename);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|v| rename_quant_lists(v, rename)),
        _ => {}
    }
}

/// A list `quantize --format modelopt` wrote, written again for the renamed modules (`None`
/// for any other list).
fn modelopt_list_renamed(a: &[Value], rename: &dyn Fn(&str) -> String) -> Option<Vec<Value>> {
    use crate::quant::modelopt::exclude_modules;
    let names: Vec<String> = a
        .iter()
        .map(|e| e.as_str().map(String::from))
        .collect::<Option<_>>()?;
    // The module names: what TensorRT-LLM's names are derived from (they start with `model.`,
    // which no draft module kquant writes does).
    let modules: Vec<String> = names
        .iter()
        .filter(|n| !n.starts_with("model."))
        .cloned()
        .collect();
    if modules.len() == names.len() || exclude_modules(&modules) != names {
        return None;
    }
    let renamed: Vec<String> = modules.iter().map(|n| rename(n)).collect();
    Some(
        exclude_modules(&renamed)
            .into_iter()
            .map(Value::from)
            .collect(),
    )
}

/// Set `obj[key] = v`, creating `obj` as an object if needed.
pub(crate) fn set(obj: &mut Value, key: &str, v: Value) {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    obj.as_object_mut().unwrap().insert(key.into(), v);
}

/// Put `quantization_config` after every other key, where `quantize` appends it, so that
/// `config.json` has the same bytes whether a draft was quantized before or after converting.
pub(crate) fn quantization_config_last(cfg: &mut Value) {
    if let Some(m) = cfg.as_object_mut() {
        if let Some(q) = m.shift_remove("quantization_config") {
            m.insert("quantization_config".into(), q);
        }
    }
}

/// The block size of a DFlash config: `dflash_config.block_size`, else top-level `block_size`
/// (SGLang's order; z-lab's own drafts write the top-level key).
pub fn dflash_block_size(cfg: &Value) -> Option<u64> {
    cfg.pointer("/dflash_config/block_size")
        .and_then(Value::as_u64)
        .or_else(|| cfg.get("block_size").and_then(Value::as_u64))
}
