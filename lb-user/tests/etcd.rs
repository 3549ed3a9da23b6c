//! lb's etcd access (`lb_user::cluster::etcd`) against Debian's real etcd 3.4
//! (`lb_tests::etcd`): a listing paged at one revision and bounded by its prefix, conditional
//! writes that never overwrite unseen, a watch from a listing's revision that sees every later
//! change in order, and a watch from a compacted revision told apart. Root only.
use std::time::Duration;

use lb_tests::{etcd::EtcdCluster, netns::Netns, require_root};
use lb_user::cluster::etcd::{Change, Etcd, Watched, Written};

/// Runs `f` on a tokio runtime in `ns` (the client's sockets live there).
fn in_ns<T: Send>(ns: &Netns, f: impl AsyncFnOnce() -> T + Send) -> T {
    ns.run(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(f())
    })
    .unwrap()
}

#[test]
fn lists_writes_conditionally_and_watches_a_real_etcd() {
    if !require_root("lists_writes_conditionally_and_watches_a_real_etcd") {
        return;
    }
    let mut c = EtcdCluster::start(1).unwrap();
    let host = Netns::new("etcdcli").unwrap();
    c.attach(&host, "ctl0").unwrap();
    let endpoints = c.endpoints();
    // A key just past the prefix, which no listing or watch of it may show.
    c.etcdctl(&[], &["put", "/lb/t0", "outside"]).unwrap();
    let compacted_at = in_ns(&host, async || {
        let mut e = Etcd::connect(&endpoints, Duration::from_secs(5))
            .await
            .unwrap();
        for i in 0..25 {
            let w = e
                .put_if(&format!("/lb/t/{i:02}"), b"v", None)
                .await
                .unwrap();
            assert!(matches!(w, Written::Done { .. }), "{w:?}");
        }
        // Paged by 10: every key once, in order, none past the prefix, one revision.
        let l = e.list("/lb/t/", 10).await.unwrap();
        let keys: Vec<&str> = l.kvs.iter().map(|k| k.key.as_str()).collect();
        let want: Vec<String> = (0..25).map(|i| format!("/lb/t/{i:02}")).collect();
        assert_eq!(keys, want);
        assert!(l.kvs.iter().all(|k| k.mod_revision <= l.revision));

        // Conditional writes: a second create conflicts, a write from a stale revision
        // conflicts and says the current one, a write from the current one lands.
        let key = "/lb/t/00";
        let first = l.kvs[0].mod_revision;
        assert_eq!(
            e.put_if(key, b"again", None).await.unwrap(),
            Written::Conflict {
                current: Some(first)
            }
        );
        let Written::Done { revision: second } = e.put_if(key, b"w2", Some(first)).await.unwrap()
        else {
            panic!("a write from the current revision conflicts");
        };
        assert_eq!(
            e.put_if(key, b"stale", Some(first)).await.unwrap(),
            Written::Conflict {
                current: Some(second)
            }
        );

        // A watch from the listing's next revision sees the writes after it, in order, and
        // a delete; not the key past the prefix.
        let mut w = e.watch("/lb/t/", l.revision + 1).await.unwrap();
        e.put_if("/lb/t/new", b"n", None).await.unwrap();
        c.etcdctl(&[], &["put", "/lb/t0", "outside again"]).unwrap();
        c.etcdctl(&[], &["del", "/lb/t/01"]).unwrap();
        let mut seen = Vec::new();
        while seen.len() < 3 {
            match tokio::time::timeout(Duration::from_secs(5), w.next()).await {
                Ok(Ok(Some(Watched::Changes(c)))) => seen.extend(c),
                other => panic!("the watch gave {other:?} after {seen:?}"),
            }
        }
        let keys: Vec<(&str, i64)> = (seen.iter())
            .map(|c| match c {
                Change::Put(kv) => (kv.key.as_str(), kv.mod_revision),
                Change::Delete { key, mod_revision } => (key.as_str(), *mod_revision),
            })
            .collect();
        assert_eq!(keys[0], ("/lb/t/00", second), "{seen:?}");
        assert_eq!(keys[1].0, "/lb/t/new", "{seen:?}");
        assert!(
            matches!(&seen[2], Change::Delete { key, mod_revision } if key == "/lb/t/01" && *mod_revision > keys[1].1),
            "{seen:?}"
        );
        l.revision
    });

    // Compacted past the listing's revision: a watch from it is told so, not given changes.
    let status = c
        .etcdctl::<&str>(&[], &["endpoint", "status", "-w", "json"])
        .unwrap();
    let now: serde_json::Value = serde_json::from_str(&status).unwrap();
    let now = now[0]["Status"]["header"]["revision"].as_i64().unwrap();
    c.etcdctl(&[], &["compact", &now.to_string()]).unwrap();
    in_ns(&host, async || {
        let mut e = Etcd::connect(&endpoints, Duration::from_secs(5))
            .await
            .unwrap();
        let mut w = e.watch("/lb/t/", compacted_at + 1).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), w.next()).await;
        assert!(
            matches!(got, Ok(Ok(Some(Watched::Compacted { compact_revision }))) if compact_revision == now),
            "{got:?}"
        );
    });
}
