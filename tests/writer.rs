//! The streaming writer: byte-identical to the `safetensors` library, sharding + index,
//! atomic output (nothing under the final name unless complete), manifest hashes.

use std::collections::HashMap;
use std::path::Path;

use kquant::io::manifest::Manifest;
use kquant::io::source;
use kquant::io::writer::{TensorSpec, WriteOptions, Writer};
use kquant::io::Dtype;

fn tensors() -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    let mk = |n: &str, d: Dtype, s: Vec<usize>| {
        let len = s.iter().product::<usize>() * d.size();
        let data = (0..len).map(|i| (i * 31 + n.len() * 7) as u8).collect();
        (n.to_string(), d, s, data)
    };
    vec![
        mk("b.weight", Dtype::BF16, vec![8, 4]),
        mk("a.weight", Dtype::BF16, vec![16, 4]),
        mk("d2t", Dtype::I64, vec![5]),
        mk("t2d", Dtype::BOOL, vec![9]),
        mk("scale", Dtype::F32, vec![3]),
        mk("packed", Dtype::I32, vec![4, 2]),
        mk("empty", Dtype::F16, vec![0, 4]),
    ]
}

fn write_all(out: &Path, opts: WriteOptions) -> kquant::Result<kquant::io::writer::WriteSummary> {
    let ts = tensors();
    let specs = ts
        .iter()
        .map(|(n, d, s, _)| TensorSpec::new(n.clone(), *d, s.clone()))
        .collect();
    let mut w = Writer::create(out, specs, opts)?;
    let by: HashMap<String, &Vec<u8>> = ts.iter().map(|(n, _, _, b)| (n.clone(), b)).collect();
    for name in w.order().into_iter().map(String::from).collect::<Vec<_>>() {
        let data = by[&name];
        // Write in two parts to exercise streaming.
        let half = data.len() / 2;
        w.write_part(&name, &data[..half])?;
        w.write_part(&name, &data[half..])?;
        w.end_tensor(&name)?;
    }
    w.add_file("config.json", b"{}")?;
    w.finish()
}

#[test]
fn single_file_is_byte_identical_to_the_safetensors_library() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o");
    write_all(&out, WriteOptions::default()).unwrap();
    let ours = std::fs::read(out.join("model.safetensors")).unwrap();

    let ts = tensors();
    let views: Vec<(String, safetensors::tensor::TensorView)> = ts
        .iter()
        .map(|(n, d, s, b)| {
            let dt = match d {
                Dtype::BF16 => safetensors::Dtype::BF16,
                Dtype::I64 => safetensors::Dtype::I64,
                Dtype::BOOL => safetensors::Dtype::BOOL,
                Dtype::F32 => safetensors::Dtype::F32,
                Dtype::I32 => safetensors::Dtype::I32,
                Dtype::F16 => safetensors::Dtype::F16,
                _ => unreachable!(),
            };
            (
                n.clone(),
                safetensors::tensor::TensorView::new(dt, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let reference = safetensors::serialize(views, None).unwrap();
    assert_eq!(
        ours, reference,
        "header, order and data must match the safetensors library byte for byte"
    );
}

#[test]
fn sharded_output_has_hf_names_and_index() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o");
    let s = write_all(
        &out,
        WriteOptions {
            max_shard_size: Some(100),
            ..Default::default()
        },
    )
    .unwrap();
    let shards: Vec<_> = s
        .files
        .iter()
        .filter(|f| f.file.ends_with(".safetensors"))
        .collect();
    assert!(shards.len() >= 2);
    for (i, f) in shards.iter().enumerate() {
        assert_eq!(
            f.file,
            format!("model-{:05}-of-{:05}.safetensors", i + 1, shards.len())
        );
    }
    let idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let total: u64 = tensors().iter().map(|(_, _, _, b)| b.len() as u64).sum();
    assert_eq!(idx["metadata"]["total_size"], total);
    let w = source::open(out.to_str().unwrap()).unwrap();
    assert_eq!(w.len(), tensors().len());
    for (n, _, s, b) in tensors() {
        let v = w.tensor(&n).unwrap();
        assert_eq!(v.shape(), s.as_slice());
        assert_eq!(v.data, b.as_slice(), "{n}");
    }
}

#[test]
fn manifest_hashes_every_file_and_verify_files_checks_them() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o");
    let input = t.path().join("input.bin");
    std::fs::write(&input, b"hello").unwrap();
    write_all(
        &out,
        WriteOptions {
            max_shard_size: Some(100),
            inputs: vec![input],
            command: vec!["kquant".into(), "test".into()],
            ..Default::default()
        },
    )
    .unwrap();
    let m = Manifest::read(&out).unwrap();
    assert_eq!(
        m.inputs[0].sha256.as_deref().unwrap(),
        "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    );
    assert_eq!(m.command, vec!["kquant", "test"]);
    assert!(m.outputs.iter().any(|o| o.file == "config.json"));
    assert!(m
        .outputs
        .iter()
        .any(|o| o.file == "model.safetensors.index.json"));
    let c = m.check(&out).unwrap();
    assert!(c.passed(), "{c:?}");
    assert_eq!(c.ok.len(), m.outputs.len());
    let shard = out.join("model-00001-of-00002.safetensors");
    let shard = if shard.exists() {
        shard
    } else {
        out.join(
            &m.outputs
                .iter()
                .find(|o| o.file.starts_with("model-"))
                .unwrap()
                .file,
        )
    };
    let mut b = std::fs::read(&shard).unwrap();
    let last = b.len() - 1;
    b[last] ^= 1;
    std::fs::write(&shard, b).unwrap();
    std::fs::write(out.join("extra.txt"), b"x").unwrap();
    let c = m.check(&out).unwrap();
    assert!(!c.passed());
    assert_eq!(c.mismatched.len(), 1);
    assert_eq!(c.unlisted, vec!["extra.txt"]);
}

#[test]
fn existing_output_is_refused_unless_forced() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep"), b"x").unwrap();
    let e = write_all(&out, WriteOptions::default()).unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    assert!(e.hint().unwrap().contains("--force"));
    assert!(out.join("keep").exists());
    let force = || WriteOptions {
        force: true,
        ..Default::default()
    };
    // --force replaces only what kquant wrote: this directory has no manifest.
    let e = write_all(&out, force()).unwrap_err();
    assert!(e.to_string().contains("not an output kquant wrote"), "{e}");
    assert!(out.join("keep").exists());
    std::fs::remove_dir_all(&out).unwrap();
    write_all(&out, WriteOptions::default()).unwrap();
    write_all(&out, force()).unwrap();
    assert!(out.join("model.safetensors").exists());
    let leftovers: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        leftovers,
        vec![std::ffi::OsString::from("o")],
        "no temporary or old directories left"
    );
}

#[test]
fn unfinished_or_wrong_writes_leave_nothing_under_the_final_name() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("o");
    let specs = vec![
        TensorSpec::new("a", Dtype::F32, vec![2]),
        TensorSpec::new("b", Dtype::F32, vec![2]),
    ];
    {
        let mut w = Writer::create(&out, specs.clone(), WriteOptions::default()).unwrap();
        assert_eq!(w.order(), vec!["a", "b"]);
        let e = w.write("b", &[0; 8]).unwrap_err();
        assert!(e.to_string().contains("out of order"), "{e}");
        let e = w.write_part("a", &[0; 9]).unwrap_err();
        assert!(e.to_string().contains("more than the declared"), "{e}");
        w.write_part("a", &[0; 4]).unwrap();
        let e = w.end_tensor("a").unwrap_err();
        assert!(e.to_string().contains("wrote 4 bytes, declared 8"), "{e}");
        // dropped here, unfinished
    }
    assert!(!out.exists());
    let mut w = Writer::create(&out, specs.clone(), WriteOptions::default()).unwrap();
    w.write("a", &[0; 8]).unwrap();
    let e = w.finish().unwrap_err();
    assert!(
        e.to_string().contains("`b` was declared but never written"),
        "{e}"
    );
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(t.path()).unwrap().count(),
        0,
        "temporary directory removed"
    );
    let e = Writer::create(
        &out,
        vec![specs[0].clone(), specs[0].clone()],
        WriteOptions::default(),
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("written twice"));
}

#[test]
fn sizes_parse() {
    use kquant::io::writer::parse_size;
    assert_eq!(parse_size("5GB").unwrap(), 5_000_000_000);
    assert_eq!(parse_size("500MiB").unwrap(), 500 << 20);
    assert_eq!(parse_size("1000").unwrap(), 1000);
    assert!(parse_size("5XB").is_err());
    assert!(parse_size("0").is_err());
}
