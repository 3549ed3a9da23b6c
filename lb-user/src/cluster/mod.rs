//! Many nodes, one desired state: the cluster's services from etcd (issue #26). So far the
//! access to etcd ([`etcd`]); the daemon's side builds on it.
pub mod etcd;
