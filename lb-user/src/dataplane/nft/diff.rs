//! The difference between the tables of two networks, as `nft -f` transactions that cost
//! what changed: only the sets whose composed backends differ are rendered.
use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use lb_common::BUCKETS;

use super::dsr;
use super::ruleset::{
    Kind, Layout, SYNC_SET, Subnets, Unit, VIP_SET, add_elements, add_unit, base, declare_table,
    delete_elements, delete_table, delete_unit, dispatch_elements, has_ipv6, nft_key, shape_name,
    slot, sync_token, table,
};
use crate::core::{
    compose::{Composed, ComposedNetwork},
    elements::{SetKey, equal_weight_intervals},
    model::Family,
};

/// The sets whose composed backends differ between `previous` and `network` (a set absent
/// from one of them included). Every other set renders the same in both, so the difference
/// of the two tables is the difference of these sets' elements, at the cost of what changed
/// (one service's sets, or those its generations share).
fn changed(previous: &Composed, network: &Composed) -> BTreeSet<SetKey> {
    fn differing<'a, K: Ord + Copy, V: PartialEq>(
        a: &'a BTreeMap<K, V>,
        b: &'a BTreeMap<K, V>,
    ) -> impl Iterator<Item = K> + 'a {
        (a.keys().chain(b.keys()))
            .filter(|k| a.get(k) != b.get(k))
            .copied()
    }
    (differing(&previous.vips, &network.vips).map(SetKey::Vip))
        .chain(differing(&previous.ports, &network.ports).map(SetKey::Port))
        .collect()
}

/// The units a network's table holds for its sets other than `skip`, without rendering their
/// elements: a set's shape is its partition, which depends on its number of backends only
/// (the same function `placed_elements` partitions by), so one shape per count. `dsr`: the
/// DSR table's units (its VIPs alone) rather than the NAT table's.
pub(super) fn units_in_use(
    composed: &Composed,
    family: Family,
    skip: &dyn Fn(&SetKey) -> bool,
    dsr: bool,
) -> BTreeSet<Unit> {
    let mut shapes: BTreeMap<usize, String> = BTreeMap::new();
    let mut shape = |n: usize| -> String {
        (shapes.entry(n))
            .or_insert_with(|| {
                let slots = vec![(); n];
                let intervals: Vec<String> = equal_weight_intervals(&slots, BUCKETS)
                    .map(|(i, _)| i.to_string())
                    .collect();
                shape_name(&intervals)
            })
            .clone()
    };
    let vip_kind = if dsr {
        Kind::RealServer(family)
    } else {
        Kind::Vip
    };
    let vips = (composed.vips.iter())
        .filter(|(v, _)| Family::of(**v) == family && !skip(&SetKey::Vip(**v)))
        .map(|(_, b)| (vip_kind, b.len()));
    let ports = (composed.ports.iter())
        .filter(|(k, _)| !dsr && k.family == family && !skip(&SetKey::Port(**k)))
        .map(|(key, b)| {
            let kind = if key.host_ip.is_some() {
                Kind::HostPort
            } else {
                Kind::Port
            };
            (kind, b.len())
        });
    (vips.chain(ports))
        .filter(|(_, n)| *n > 0)
        .map(|(kind, n)| (kind, shape(n)))
        .collect()
}

/// A difference between two networks' tables: at most two transactions, run in order.
#[derive(Debug)]
pub struct Update {
    /// The transaction that declares the units (chains and maps of a shape) the network starts
    /// to use, with their elements, before anything can reach them; `None` when every unit
    /// it needs is in the table already. Why it cannot be part of `script`: a set with a commit
    /// step of its own (the interval maps of a unit are rbtree sets, whose lookups read an
    /// array rebuilt at the end of the commit) answers nothing between the generation switch
    /// and that step, so a packet sent to a unit declared in the same transaction finds no
    /// interval, takes no translation and reaches the node itself, which resets it (seen: a
    /// burst of such resets, a few every time a rolling update changed a set's number of
    /// backends). Declared one transaction ahead, a unit is whole before the dispatch entry
    /// that leads to it. Like `script`, it starts with the [`SYNC_SET`] check (it leaves the
    /// element as it is), and it declares its units over whatever an earlier, failed sync
    /// left of them.
    pub prepare: Option<String>,
    /// The transaction that switches the table to the network: dispatch entries, elements of
    /// units already there.
    pub script: String,
    /// The transaction that deletes the units nothing leads to any more, after `script`
    /// (`None`: none): a packet that read a dispatch entry just before the switch may still
    /// be on its way through the old unit, and a set deleted in the same transaction (an
    /// interval map whose lookup array goes with its commit step) may answer nothing by the
    /// time it gets there — seen as one reset in ~400 shape changes while they went with the
    /// switch. It starts with the [`SYNC_SET`] check of the network's own token.
    pub retire: Option<String>,
    /// Moby's elements it adds and deletes (a changed element counts in both).
    pub written: usize,
    pub deleted: usize,
}

/// The `nft -f` transactions that turn the tables written for `previous` into `network`'s:
/// sets of a new shape get their chains (in [`Update::prepare`]), elements that changed are
/// deleted and added again, dispatch entries follow, chains no set uses any more go.
/// Elements that did not change are not touched, so their counters keep counting. Each
/// transaction starts with [`SYNC_SET`]'s element `sync_token(previous)` in each table it
/// changes (the last one replaces it), so a table that is not the one written for `previous`
/// (deleted, flushed, declared by someone else) fails it, which changes nothing; the caller
/// then declares the tables whole. The IPv6 table is declared whole in `prepare` when the
/// network gains IPv6 sets, and deleted in `script` when it has none left. The DSR table
/// follows as `dsr` says (`dsr::update`: its units in the same three transactions; a DSR
/// table that appears or goes, whole in `script`).
pub fn update(
    previous: &ComposedNetwork,
    network: &ComposedNetwork,
    subnets: &Subnets,
    dsr: &dsr::Sync,
) -> Result<Update> {
    let changed = changed(previous.composed(), network.composed());
    update_sets(previous, network, &changed, subnets, dsr)
}

/// [`update`] of a change of the sets `changed` alone (every other set the same in both, as a
/// change of services alone leaves them; a set in `sets` that did not change renders no
/// difference): what one change costs, whatever the network's size.
pub fn update_sets(
    previous: &ComposedNetwork,
    network: &ComposedNetwork,
    changed: &BTreeSet<SetKey>,
    subnets: &Subnets,
    dsr: &dsr::Sync,
) -> Result<Update> {
    // Each a hash of the whole network: computed once for every transaction of both tables.
    let tokens = (sync_token(previous), sync_token(network));
    let mut u = table_update(previous, network, Family::V4, changed, subnets, tokens);
    match (has_ipv6(previous), has_ipv6(network)) {
        (true, true) => u.merge(table_update(
            previous,
            network,
            Family::V6,
            changed,
            subnets,
            tokens,
        )),
        (false, true) => {
            u.written += declare_table(&mut u.prepare, network, Family::V6, subnets);
            u.declared = true;
        }
        (true, false) => delete_table(&mut u.script, &table(Family::V6, &network.name)),
        (false, false) => {}
    }
    let within = |k: &SetKey| changed.contains(k);
    dsr::update(&mut u, network, previous, &within, dsr);
    Ok(Update {
        prepare: u.declared.then_some(u.prepare),
        retire: u.retired.then_some(u.retire),
        script: u.script,
        written: u.written,
        deleted: u.deleted,
    })
}

/// One table's part of an [`Update`] (or several tables', merged): each transaction's
/// commands for it, the token check included.
pub(super) struct TableUpdate {
    pub prepare: String,
    /// Whether `prepare` declares anything (else the check alone, not worth a transaction).
    pub declared: bool,
    pub script: String,
    pub retire: String,
    pub retired: bool,
    pub written: usize,
    pub deleted: usize,
}

impl TableUpdate {
    /// Adds another table's part: each transaction runs both.
    fn merge(&mut self, other: TableUpdate) {
        self.prepare += &other.prepare;
        self.declared |= other.declared;
        self.script += &other.script;
        self.retire += &other.retire;
        self.retired |= other.retired;
        self.written += other.written;
        self.deleted += other.deleted;
    }
}

/// The difference of `network`'s table of `family` from `previous`'s, over the sets of
/// `changed` of that family; `(before, after)` are the two networks' sync tokens.
fn table_update(
    previous: &ComposedNetwork,
    network: &ComposedNetwork,
    family: Family,
    changed: &BTreeSet<SetKey>,
    subnets: &Subnets,
    (before, after): (u32, u32),
) -> TableUpdate {
    let t = table(family, &network.name);
    let within = |k: &SetKey| k.family() == family && changed.contains(k);
    let (old, new) = (
        Layout::of_sets(previous, within),
        Layout::of_sets(network, within),
    );
    // Replaces the table's token `from` by `to`: fails on a table that does not hold `from`.
    let swap = |from: u32, to: u32| {
        format!(
            "delete element {t} {SYNC_SET} {{ {from} }}\nadd element {t} {SYNC_SET} {{ {to} }}\n"
        )
    };
    let mut u = TableUpdate {
        prepare: swap(before, before),
        declared: false,
        script: swap(before, after),
        retire: swap(after, after),
        retired: false,
        written: 0,
        deleted: 0,
    };
    let skip = |k: &SetKey| changed.contains(k);
    let rest = || units_in_use(network.composed(), family, &skip, false);
    layout_update(&mut u, &t, family, VIP_SET, (&old, &new), rest);
    base(&mut u.script, &t, family, network, subnets);
    u
}

/// What turns table `t`'s objects of layout `old` into `new`'s (both of the same sets, of
/// `family`), into `u`: the VIP set `vip_set`'s elements; units that come, declared and
/// filled in `prepare` (see [`Update::prepare`]); slot elements and dispatch entries that
/// changed, in `script`; units that go, in `retire`. Whether the table has a unit also
/// depends on its other sets, whose units `rest` gives; it is only asked for when a unit
/// may come or go.
pub(super) fn layout_update(
    u: &mut TableUpdate,
    t: &str,
    family: Family,
    vip_set: &str,
    (old, new): (&Layout, &Layout),
    rest: impl FnOnce() -> BTreeSet<Unit>,
) {
    let same_units = old.units.keys().eq(new.units.keys());
    let rest = if same_units { BTreeSet::new() } else { rest() };
    let had = |u: &Unit| old.units.contains_key(u) || rest.contains(u);
    let has = |u: &Unit| new.units.contains_key(u) || rest.contains(u);
    let s = &mut u.script;
    delete_elements(
        s,
        t,
        vip_set,
        old.vips
            .difference(&new.vips)
            .map(|v| v.to_string())
            .collect(),
    );
    add_elements(
        s,
        t,
        vip_set,
        new.vips
            .difference(&old.vips)
            .map(|v| v.to_string())
            .collect(),
    );
    for (unit, intervals) in &new.units {
        if !had(unit) {
            add_unit(&mut u.prepare, t, family, unit, intervals);
            u.declared = true;
        }
    }
    // Slot elements: those gone or changed leave, those new or changed come; a unit that
    // goes takes its maps whole.
    let empty = BTreeMap::new();
    for slot_id in old
        .slots
        .keys()
        .chain(new.slots.keys())
        .collect::<BTreeSet<_>>()
    {
        let (kind, shape, k) = slot_id;
        let was = old.slots.get(slot_id).unwrap_or(&empty);
        let now = new.slots.get(slot_id).unwrap_or(&empty);
        let map = slot(*kind, shape, *k);
        if has(&(*kind, shape.clone())) {
            let gone: Vec<String> = (was.iter())
                .filter(|(key, v)| now.get(*key) != Some(v))
                .map(|(key, _)| nft_key(key))
                .collect();
            u.deleted += gone.len();
            delete_elements(&mut u.script, t, &map, gone);
        } else {
            u.deleted += was.len();
        }
        let come: Vec<String> = (now.iter())
            .filter(|(key, v)| was.get(*key) != Some(v))
            .map(|(key, v)| format!("{} : {v}", nft_key(key)))
            .collect();
        u.written += come.len();
        // A new unit is filled where it is declared: whole before anything leads to it.
        let to = if had(&(*kind, shape.clone())) {
            &mut u.script
        } else {
            &mut u.prepare
        };
        add_elements(to, t, &map, come);
    }
    // Dispatch entries that changed are deleted and added again (an add never replaces).
    let mut gone: BTreeMap<Kind, Vec<String>> = BTreeMap::new();
    for (set, unit) in &old.dispatch {
        if new.dispatch.get(set) != Some(unit) {
            gone.entry(unit.0).or_default().push(nft_key(set));
        }
    }
    for (kind, items) in gone {
        delete_elements(&mut u.script, t, kind.dispatch(), items);
    }
    dispatch_elements(&mut u.script, t, &new.dispatch, |k| {
        old.dispatch.get(k) != new.dispatch.get(k)
    });
    for (unit, intervals) in &old.units {
        if !has(unit) {
            delete_unit(&mut u.retire, t, unit, intervals.len());
            u.retired = true;
        }
    }
}

#[cfg(test)]
mod tests;
