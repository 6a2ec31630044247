//! The shared object exports what rdma-core 44's libraries export, with the same versions:
//! every symbol Debian 12's RDMA programs import (rdma-core's tools, perftest), and every
//! public symbol of libibverbs.so.1 and librdmacm.so.1. The lists were taken from Debian's
//! binaries with `objdump -T` (tests/data/*.txt), so this test needs no RDMA package.

mod util;

use std::collections::BTreeSet;

/// (name, version) pairs the shared object defines, read from its dynamic symbol table.
fn exported() -> BTreeSet<(String, String)> {
    let so = util::shared_object();
    let out = std::process::Command::new("objdump")
        .arg("-T")
        .arg(&so)
        .output()
        .expect("objdump (binutils) runs");
    assert!(out.status.success(), "objdump -T {} failed", so.display());
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| l.contains(" g ") && !l.contains("*UND*"))
        .filter_map(|l| {
            let mut f = l.split_whitespace().rev();
            let name = f.next()?.to_string();
            let ver = f.next()?.to_string();
            Some((name, ver))
        })
        .collect()
}

fn pairs(file: &str, name_col: usize) -> Vec<(String, String, String)> {
    let path = format!("{}/tests/data/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3).then(|| (f[0].to_string(), f[1].to_string(), f[name_col].to_string()))
        })
        .collect()
}

#[test]
fn every_import_of_debians_rdma_programs_is_exported_at_its_version() {
    let ours = exported();
    let imports = pairs("debian-12-imports.txt", 2);
    assert!(
        imports.len() > 500,
        "the import list is there ({} lines)",
        imports.len()
    );
    let missing: BTreeSet<String> = imports
        .iter()
        .filter(|(_, ver, name)| !ours.contains(&(name.clone(), ver.clone())))
        .map(|(prog, ver, name)| format!("{name}@{ver} (imported by {prog})"))
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:#?}");
}

#[test]
fn every_public_symbol_of_libibverbs_and_librdmacm_is_exported_at_its_version() {
    let ours = exported();
    let missing: Vec<String> = pairs("rdma-core-44-exports.txt", 2)
        .into_iter()
        .filter(|(lib, ver, _)| {
            (lib == "libibverbs.so.1" && !ver.contains("PRIVATE")) || lib == "librdmacm.so.1"
        })
        .filter(|(_, ver, name)| !ours.contains(&(name.clone(), ver.clone())))
        .map(|(lib, ver, name)| format!("{lib}: {name}@{ver}"))
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:#?}");
}

#[test]
fn soname_is_libibverbs_so_1() {
    let out = std::process::Command::new("objdump")
        .arg("-p")
        .arg(util::shared_object())
        .output()
        .expect("objdump runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.contains("SONAME") && l.trim_end().ends_with("libibverbs.so.1")),
        "{text}"
    );
}

/// The provider stand-ins are whole: every function rdma-core 44's libmlx5.so.1 and libefa.so.1
/// export, at its version (libfabric and rdma-core's own tests bind every symbol at load time).
#[test]
fn every_function_of_libmlx5_and_libefa_is_exported_at_its_version() {
    let ours = exported();
    let theirs = pairs("rdma-core-44-exports.txt", 2);
    let providers: Vec<_> = theirs
        .iter()
        .filter(|(lib, _, _)| lib == "libmlx5.so.1" || lib == "libefa.so.1")
        .collect();
    assert!(
        providers.len() > 130,
        "{} provider symbols listed",
        providers.len()
    );
    let missing: Vec<String> = providers
        .iter()
        .filter(|(_, ver, name)| !ours.contains(&(name.clone(), ver.clone())))
        .map(|(lib, ver, name)| format!("{lib}: {name}@{ver}"))
        .collect();
    assert!(missing.is_empty(), "not exported: {missing:#?}");
    // Against the real libraries, where Debian's are installed.
    for lib in ["libmlx5.so.1", "libefa.so.1"] {
        let real = std::path::Path::new("/usr/lib/x86_64-linux-gnu").join(lib);
        let Ok(out) = std::process::Command::new("objdump")
            .arg("-T")
            .arg(&real)
            .output()
        else {
            continue;
        };
        if !out.status.success() {
            eprintln!(
                "{}: not installed, compared with the list only",
                real.display()
            );
            continue;
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let missing: Vec<String> = text
            .lines()
            .filter(|l| l.contains(" g ") && l.contains(" DF .text"))
            .filter_map(|l| {
                let mut f = l.split_whitespace().rev();
                Some((f.next()?.to_string(), f.next()?.to_string()))
            })
            .filter(|p| !ours.contains(p))
            .map(|(n, v)| format!("{lib}: {n}@{v}"))
            .collect();
        assert!(
            missing.is_empty(),
            "the installed {lib} has more: {missing:#?}"
        );
    }
}

/// The generated stand-ins are what `capi/tools/gen_stubs.py` writes today (where Python and
/// the providers' headers are installed).
#[test]
fn the_generated_stand_ins_are_up_to_date() {
    let script = format!("{}/tools/gen_stubs.py", env!("CARGO_MANIFEST_DIR"));
    if !std::path::Path::new("/usr/include/infiniband/mlx5dv.h").exists() {
        eprintln!("no mlx5dv.h (libibverbs-dev): skipped");
        return;
    }
    let Ok(out) = std::process::Command::new("python3")
        .args([script.as_str(), "--check"])
        .output()
    else {
        eprintln!("no python3: skipped");
        return;
    };
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
