use super::*;

fn state() -> DesiredState {
    DesiredState::from_json(
        r#"{"networks": [
                {"name": "web", "interfaces": ["br0"], "services": [
                    {"id": "b", "vip": "10.99.0.2", "backends": [{"ip": "10.20.0.2"}]},
                    {"id": "a", "vip": "10.99.0.1", "backends": [{"ip": "10.20.0.1"}]}
                ]},
                {"name": "db", "interfaces": ["br1"], "mode": "dsr"}
            ]}"#,
    )
    .unwrap()
}

#[test]
fn a_migrated_state_reads_back_as_it_was_in_its_order() {
    let dir = tempdir();
    std::fs::write(dir.join(LEGACY), state().to_json()).unwrap();
    let opened = Store::open(&dir, None).unwrap();
    assert_eq!(opened.state, state());
    assert_eq!(opened.origin, Origin::Imported(dir.join(LEGACY)));
    assert!(!dir.join(LEGACY).exists() && dir.join("state.json.migrated").exists());
    drop(opened);
    let again = Store::open(&dir, None).unwrap();
    assert_eq!((again.state, again.origin), (state(), Origin::Existing));
}

#[test]
fn commits_keep_places_and_count_revisions() {
    let dir = tempdir();
    let mut opened = Store::open(&dir, None).unwrap();
    assert_eq!(opened.origin, Origin::Created);
    let s = state();
    let web = s.network("web").unwrap();
    let mut writes = vec![Write::Network {
        settings: web,
        fresh: false,
    }];
    let keys: Vec<ServiceKey> = web.services.iter().map(Service::key).collect();
    for (k, svc) in keys.iter().zip(&web.services) {
        writes.push(Write::Service {
            network: "web",
            key: k,
            service: Some(svc),
            fresh: false,
        });
    }
    // Revision 1 is the state the store was created with.
    let log = |r: u64| format!("{r}").into_bytes();
    assert_eq!(opened.store.commit(&writes, log).unwrap(), (2, 3));
    // Replaced in place: b stays first.
    let mut b = web.services[0].clone();
    b.backends.clear();
    let (rev, n) = (opened.store)
        .commit(
            &[Write::Service {
                network: "web",
                key: &b.key(),
                service: Some(&b),
                fresh: false,
            }],
            log,
        )
        .unwrap();
    assert_eq!((rev, n), (3, 1));
    let history = |from| {
        (opened.store.history(from).unwrap()).map(|h| {
            h.into_iter()
                .map(|e| String::from_utf8(e).unwrap())
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(history(1), Some(vec!["2".to_owned(), "3".to_owned()]));
    assert_eq!(history(3), Some(vec![]));
    assert_eq!(
        history(0).map(|h| h.len()),
        Some(3),
        "from before the import: all of it"
    );
    drop(opened);
    let again = Store::open(&dir, None).unwrap();
    assert_eq!(again.store.revision(), 3);
    let ids: Vec<&str> = (again.state.networks[0].services.iter())
        .map(|s| s.id.as_str())
        .collect();
    assert_eq!(ids, ["b", "a"]);
    assert!(again.state.networks[0].services[0].backends.is_empty());
}

#[test]
fn a_store_that_is_not_one_is_refused_with_the_way_out() {
    let dir = tempdir();
    std::fs::write(dir.join(FILE), b"not a database at all, just text").unwrap();
    let e = format!("{:#}", Store::open(&dir, None).err().expect("refused"));
    assert!(
        e.contains("cannot be read") && e.contains("lb daemon --import FILE"),
        "{e}"
    );
    // A truncated one too.
    let dir = tempdir();
    std::fs::write(dir.join(LEGACY), state().to_json()).unwrap();
    drop(Store::open(&dir, None).unwrap());
    let bytes = std::fs::read(dir.join(FILE)).unwrap();
    std::fs::write(dir.join(FILE), &bytes[..bytes.len() / 3]).unwrap();
    let e = format!("{:#}", Store::open(&dir, None).err().expect("refused"));
    assert!(
        e.contains("cannot be read") && e.contains("lb daemon --import FILE"),
        "{e}"
    );
    // And the import is the way out.
    let export = dir.join("export.json");
    std::fs::write(&export, state().to_json()).unwrap();
    let opened = Store::open(&dir, Some(&export)).unwrap();
    assert_eq!(opened.state, state());
    assert!(dir.join("state.redb.before-import").exists());
}

/// A directory of its own, removed on drop (a failed test's too).
struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir() -> TempDir {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "lb-store-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}
