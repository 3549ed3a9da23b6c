//! The runner both tiers share: rounds over the fixture's programs, every run checked, the
//! summary and the coverage a long run must reach.
use super::*;

/// One program's runs in a fuzz test.
#[derive(Default)]
pub(super) struct ProgStats {
    runs: usize,
    refused: usize,
    passed: usize,
    translated: usize,
    dropped: usize,
    /// Translations whose input had checksums that held, all re-checked on the output.
    sums_kept: usize,
    /// The outcomes that runs of packets that may be for a service counted, by label.
    outcomes: BTreeMap<&'static str, u64>,
}

/// What a fuzz test ran and saw, for its summary and its coverage checks.
pub(super) struct Stats<M> {
    packets: BTreeMap<(Kind, Class), usize>,
    mutations: BTreeMap<M, usize>,
    untouchable: usize,
    progs: [ProgStats; 3],
    /// Translations per program and kind of packet.
    translated: BTreeMap<(Prog, Kind), usize>,
    /// Checksums that held in a translated packet and were re-checked on its output, by name.
    kept: BTreeMap<&'static str, usize>,
    flushes: usize,
}

impl<M> Default for Stats<M> {
    fn default() -> Self {
        Stats {
            packets: BTreeMap::new(),
            mutations: BTreeMap::new(),
            untouchable: 0,
            progs: Default::default(),
            translated: BTreeMap::new(),
            kept: BTreeMap::new(),
            flushes: 0,
        }
    }
}

/// Runs the fuzz test `test` of tier `T`: its share of `LB_FUZZ_PACKETS` through the programs
/// of a fixture of `net`, the flow hash key and the generator's seed following from
/// `LB_FUZZ_SEED` (or a fresh seed) and `salt`, which tells apart the tests that run under one
/// seed; then, from [`COVERAGE_FROM`] packets on, [`Fuzz::assert_coverage`].
pub fn run_tier<T: Tier>(
    test: &'static str,
    salt: u64,
    net: Network,
    generator: impl FnOnce(u64) -> T,
) where
    FlowKeyOf<T::Addr>: Pod,
    FlowOf<T::Addr>: Pod,
{
    if !require_root(test) {
        return;
    }
    let seed = seed_from_env("LB_FUZZ_SEED");
    let total = packets_from_env();
    println!("{test}: LB_FUZZ_SEED={seed:#x} LB_FUZZ_PACKETS={total}");
    let mut rng = Rng::new(seed ^ salt);
    let hash_key = rng.u32() | 1;
    let masquerade = net.masquerade;
    let mut f = Fixture::with_network(net, Some(hash_key));
    let handoff = f.handoff();
    let outcomes = Outcomes::new(&mut f);
    let mut fuzz = Fuzz {
        test,
        seed,
        total,
        f,
        generator: generator(rng.next_u64()),
        masquerade,
        handoff,
        outcomes,
        stats: Stats::default(),
    };
    let packets = total.div_ceil(T::SHARE);
    fuzz.run(packets);
    if packets >= COVERAGE_FROM {
        fuzz.assert_coverage();
    }
}

/// One fuzz test of a tier: the fixture, the generator and the counts.
pub struct Fuzz<T: Tier> {
    test: &'static str,
    pub seed: u64,
    /// `LB_FUZZ_PACKETS` (what repeats a run).
    total: usize,
    pub f: Fixture,
    pub generator: T,
    masquerade: Masquerade,
    /// What XDP must leave in the metadata of a packet it translated.
    handoff: u32,
    outcomes: Outcomes,
    stats: Stats<T::Mutation>,
}

impl<T: Tier> Fuzz<T>
where
    FlowKeyOf<T::Addr>: Pod,
    FlowOf<T::Addr>: Pod,
{
    /// Panics with everything needed to repeat the failure.
    pub fn fail(&self, case: &Case<T::Mutation>, prog: Prog, out: Option<&[u8]>, what: &str) -> ! {
        panic!(
            "{what}\n  packet #{} ({:?}, {:?}, mutations {:?}) through {prog:?} (order {:?}, \
             TC ingress_ifindex {:?})\n  in:  {}\n  out: {}\n  repeat with LB_FUZZ_SEED={:#x} \
             LB_FUZZ_PACKETS={} cargo test -p lb-tests --test {} {} (the same packets, in the \
             same order)",
            case.index,
            case.kind,
            case.class,
            case.mutations,
            case.order,
            case.ingress_ifindex,
            hex(&case.frame),
            out.map_or("-".into(), hex),
            self.seed,
            self.total,
            T::TARGET,
            self.test,
        )
    }

    fn run(&mut self, packets: usize) {
        let started = Instant::now();
        let mut index = 0;
        let mut flows = self.f.tables_of::<T::Addr>().flows.len();
        while index < packets {
            if flows > TABLE_CAP {
                self.f.restore_of(&TablesOf::<T::Addr>::default());
                self.generator.forget();
                self.stats.flushes += 1;
            }
            let n = ROUND.min(packets - index);
            let cases: Vec<_> = (index..index + n).map(|i| self.generator.case(i)).collect();
            for c in &cases {
                *self.stats.packets.entry((c.kind, c.class)).or_default() += 1;
                for m in &c.mutations {
                    *self.stats.mutations.entry(*m).or_default() += 1;
                }
            }
            let (untouchable, candidates): (Vec<_>, Vec<_>) =
                cases.into_iter().partition(|c| c.untouchable);
            self.stats.untouchable += untouchable.len();
            for case in &candidates {
                self.run_case(case, true);
            }
            flows = self.untouchable_phase(&untouchable, index).flows.len();
            T::round_done(self, index);
            index += n;
        }
        self.summary(packets, started.elapsed().as_secs_f64());
    }

    /// Runs what cannot be for a service (of the round from packet `first` on): the tables
    /// must not move, and the outcomes counted must all be ones such a packet may have.
    /// Returns the tables.
    fn untouchable_phase(
        &mut self,
        cases: &[Case<T::Mutation>],
        first: usize,
    ) -> TablesOf<T::Addr> {
        let before = self.f.tables_of();
        let counts_before = self.f.dp.reasons().unwrap();
        let mut ran = [0u64; 3];
        for case in cases {
            for (prog, o) in self.run_case(case, false) {
                ran[prog as usize] += u64::from(o != Outcome::Refused);
            }
        }
        let after = self.f.tables_of();
        if after != before {
            self.find_table_change(&before, &after, cases, first);
        }
        let counts_after = self.f.dp.reasons().unwrap();
        let round = format!(
            "packets #{first}.. that cannot be for a service, LB_FUZZ_SEED={:#x}",
            self.seed
        );
        let allowed = T::NOT_FOR_A_SERVICE;
        round_counted(&counts_before, &counts_after, ran, allowed, &round);
        // What these runs counted is checked: the next run's own count starts here.
        for prog in Prog::ALL {
            self.outcomes.moved(prog);
        }
        after
    }

    /// The tables changed while only packets that cannot be for a service ran: puts them back
    /// and runs those packets again one at a time to name the one that does it.
    fn find_table_change(
        &mut self,
        before: &TablesOf<T::Addr>,
        after: &TablesOf<T::Addr>,
        cases: &[Case<T::Mutation>],
        first: usize,
    ) -> ! {
        for case in cases {
            self.f.restore_of(before);
            self.run_case(case, false);
            let now = self.f.tables_of();
            if now != *before {
                let (flows, frags) = (T::Addr::FLOWS, T::Addr::FRAGS);
                let what = format!(
                    "a packet that cannot be for a service changed {flows} or {frags}: {}",
                    before.diff(&now)
                );
                self.fail(case, case.order[0], None, &what);
            }
        }
        panic!(
            "packets #{first}.. that cannot be for a service changed the tables together but not \
             alone: {}; LB_FUZZ_SEED={:#x}",
            before.diff(after),
            self.seed
        );
    }

    /// Runs `case` through the three programs in its order and checks every run; `counted`:
    /// also checks each run's outcome counters (a few syscalls per run, so only where the
    /// outcome is not known in advance).
    fn run_case(&mut self, case: &Case<T::Mutation>, counted: bool) -> Vec<(Prog, Outcome)> {
        let mut done = Vec::with_capacity(3);
        for prog in case.order {
            let ctx = if prog == Prog::Xdp {
                None
            } else {
                case.ingress_ifindex
            };
            let res = self.f.test_run(prog, &case.frame, ctx);
            let (o, out) = self.check(case, prog, res);
            if counted {
                self.check_counted(case, prog, o, out.as_deref());
            }
            let s = &mut self.stats.progs[prog as usize];
            s.runs += 1;
            match o {
                Outcome::Refused => s.refused += 1,
                Outcome::Passed => s.passed += 1,
                Outcome::Translated => s.translated += 1,
                Outcome::Dropped => s.dropped += 1,
            }
            if o == Outcome::Translated {
                *self.stats.translated.entry((prog, case.kind)).or_default() += 1;
            }
            done.push((prog, o));
        }
        done
    }

    /// One run: the kernel runs what it does not refuse for its length; the verdict is one
    /// the program may give, the handoff XDP's; a packet that cannot be for a service passes,
    /// and a passed packet leaves byte-identical; a translated one as [`Fuzz::check_translated`]
    /// says.
    fn check(
        &mut self,
        case: &Case<T::Mutation>,
        prog: Prog,
        res: Result<Run, ProgramError>,
    ) -> (Outcome, Option<Vec<u8>>) {
        let input = &case.frame;
        let run = match res {
            Err(_) if refused_by_test_run(prog, input) => return (Outcome::Refused, None),
            Err(e) => self.fail(
                case,
                prog,
                None,
                &format!("BPF_PROG_TEST_RUN failed on a frame it should run: {e:?}"),
            ),
            Ok(run) => run,
        };
        let out = run.out.as_slice();
        let Some(outcome) = Outcome::of(prog, &run) else {
            let what = format!("verdict {:#x} is not one {prog:?} may give", run.verdict);
            self.fail(case, prog, Some(out), &what);
        };
        if let Some(meta) = run.meta.filter(|m| *m != self.handoff) {
            let what = format!(
                "XDP metadata {meta:#010x} is not the handoff {:#010x}",
                self.handoff
            );
            self.fail(case, prog, Some(out), &what);
        }
        if case.untouchable && outcome != Outcome::Passed {
            let what = format!("{outcome:?} a packet that cannot be for a service");
            self.fail(case, prog, Some(out), &what);
        }
        match outcome {
            Outcome::Passed if out != input => {
                let at = (0..input.len().max(out.len()))
                    .find(|&i| input.get(i) != out.get(i))
                    .unwrap();
                let what = format!(
                    "passed (verdict {:#x}) but changed, first at byte {at}",
                    run.verdict
                );
                self.fail(case, prog, Some(out), &what);
            }
            Outcome::Translated => self.check_translated(case, prog, out),
            _ => {}
        }
        (outcome, Some(run.out))
    }

    /// A translated packet changed only addresses, ports and checksum fields, and every
    /// checksum that held in it still holds (under [`Tier::kept_as`]'s name); then the
    /// tier's own checks, and it left as its entry says ([`Fuzz::check_entry`]).
    fn check_translated(&mut self, case: &Case<T::Mutation>, prog: Prog, out: &[u8]) {
        let input = &case.frame;
        if let Some(at) = T::foreign_change(input, out) {
            let what = format!(
                "translated, and changed byte {at}, which is no address, port or checksum (or \
                 the length)"
            );
            self.fail(case, prog, Some(out), &what);
        }
        let held: Vec<&'static str> = (T::checksums(input).into_iter())
            .filter_map(|(name, ok)| ok.then_some(name))
            .collect();
        let after = T::checksums(out);
        if let Some(broken) = held
            .iter()
            .find(|n| !after.contains(&(T::kept_as(n), true)))
        {
            let what = format!(
                "translated, and the {broken} checksum, which held, is no valid {} checksum now \
                 (after: {after:?})",
                T::kept_as(broken)
            );
            self.fail(case, prog, Some(out), &what);
        }
        if !held.is_empty() {
            self.stats.progs[prog as usize].sums_kept += 1;
        }
        for name in held {
            *self.stats.kept.entry(name).or_default() += 1;
        }
        T::translated(self, case, prog, out);
        self.check_entry(case, prog, out);
    }

    /// A translated packet left as the entry of its flow says (a later fragment's found by its
    /// datagram's record, an ICMP error's by the flow it quotes), in the role that entry
    /// gives it ([`Tier::BACKENDS`], [`Tier::REPLY_FROM`], [`Tier::MASQ`]). Where the packet
    /// was no ICMP error, the generator learns its translation, to follow up on it.
    fn check_entry(&mut self, case: &Case<T::Mutation>, prog: Prog, out: &[u8]) {
        let input = &case.frame;
        let has_ports = |h: &Headers| matches!(h.frag, Frag::Later(_)) || h.l4 + 4 <= input.len();
        let Some(l) = T::Ip::headers(input).filter(has_ports) else {
            let what = format!("translated a frame that is no {} packet", T::Ip::NAME);
            self.fail(case, prog, Some(out), &what);
        };
        let (icmp, icmp_proto) = T::Ip::ICMP;
        if l.proto != icmp_proto {
            return self.flow_entry(case, prog, &l, out);
        }
        let Some(q) = T::Ip::quote(input, &l).filter(|q| q.l4 + 4 <= input.len()) else {
            let what = format!(
                "translated an {icmp} message that quotes no {} packet",
                T::Ip::NAME
            );
            self.fail(case, prog, Some(out), &what);
        };
        self.error_entry(case, prog, &l, &q, out);
    }

    /// A translated packet of a flow left as its entry says, in the role the entry gives it.
    fn flow_entry(&mut self, case: &Case<T::Mutation>, prog: Prog, l: &Headers, out: &[u8]) {
        let input = &case.frame;
        let (flows, frags) = (T::Addr::FLOWS, T::Addr::FRAGS);
        let later = matches!(l.frag, Frag::Later(_));
        let ports = (!later).then_some(l.l4);
        let mut t = Tuple::<T::Ip>::at(input, l.ip, ports);
        if let Frag::Later(id) = l.frag {
            let Some(rec) = self.f.frag_of::<T::Addr>(&t.frag_key(l.proto, id)) else {
                let what =
                    format!("translated a later fragment whose datagram has no record in {frags}");
                self.fail(case, prog, Some(out), &what);
            };
            (t.sport, t.dport) = (u16::from_be(rec.sport), u16::from_be(rec.dport));
        }
        let Some(e) = self.f.flow_of::<T::Addr>(&t.key(l.proto)) else {
            let what = format!("translated, but {flows} has no entry for its tuple {t:?}");
            self.fail(case, prog, Some(out), &what);
        };
        let want = Tuple::<T::Ip>::of_entry(&e);
        let got = Tuple::<T::Ip>::at(out, l.ip, ports);
        let as_entry = if later {
            (got.saddr, got.daddr) == (want.saddr, want.daddr)
        } else {
            got == want
        };
        let egress = prog == Prog::TcEgress;
        let role = match (egress, e.flags & FLOW_MASQ != 0) {
            (false, false) => T::BACKENDS.contains(&got.daddr),
            (false, true) => t.daddr == T::MASQ && got.saddr == t.saddr,
            (true, false) => e.flags & FLOW_REPLY != 0 && T::REPLY_FROM.contains(&got.saddr),
            (true, true) => got.saddr == T::MASQ && T::BACKENDS.contains(&got.daddr),
        };
        if !as_entry || (e.flags & FLOW_EGRESS != 0) != egress || !role {
            let what = format!(
                "translated {t:?} to {got:?}, by the entry {want:?} (flags {:#x}): it must \
                 leave as its entry says, by an entry of its own hook, a packet to the \
                 service towards an {} backend, a reply from the service's address, a \
                 masqueraded one from the node's ({})",
                e.flags,
                T::Ip::NAME,
                T::MASQ
            );
            self.fail(case, prog, Some(out), &what);
        }
        if let Frag::First(id) = l.frag {
            let rec = self.f.frag_of::<T::Addr>(&t.frag_key(l.proto, id));
            if rec.map(|r| (u16::from_be(r.sport), u16::from_be(r.dport)))
                != Some((t.sport, t.dport))
            {
                let what = format!(
                    "translated a first fragment, and {frags} holds {rec:?} for its datagram, \
                     not its ports"
                );
                self.fail(case, prog, Some(out), &what);
            }
        }
        if !later {
            self.generator.memory().observe(Seen {
                proto: l.proto,
                before: t,
                after: got,
            });
        }
    }

    /// A translated ICMP error left as the entry of the flow it quotes says (lb-ebpf
    /// `icmp.rs`): the error travels against the quoted packet, so the entry keyed by the
    /// quoted tuple reversed rewrites it; the quote becomes that entry's tuple reversed, and
    /// the outer addresses that were the quoted ones follow.
    fn error_entry(
        &mut self,
        case: &Case<T::Mutation>,
        prog: Prog,
        l: &Headers,
        q: &Headers,
        out: &[u8],
    ) {
        let input = &case.frame;
        let quoted = Tuple::<T::Ip>::at(input, q.ip, Some(q.l4));
        let Some(e) = self.f.flow_of::<T::Addr>(&quoted.reversed().key(q.proto)) else {
            let what = format!(
                "translated an {} error quoting {quoted:?}, a flow with no entry",
                T::Ip::ICMP.0
            );
            self.fail(case, prog, Some(out), &what);
        };
        let to = Tuple::<T::Ip>::of_entry(&e);
        let at = |frame| Tuple::<T::Ip>::at(frame, l.ip, None);
        let (outer, outer_out) = (at(input), at(out));
        let want_outer = (
            if outer.saddr == quoted.daddr {
                to.saddr
            } else {
                outer.saddr
            },
            if outer.daddr == quoted.saddr {
                to.daddr
            } else {
                outer.daddr
            },
        );
        let got = Tuple::<T::Ip>::at(out, q.ip, Some(q.l4));
        if got != to.reversed()
            || (outer_out.saddr, outer_out.daddr) != want_outer
            || (e.flags & FLOW_EGRESS != 0) != (prog == Prog::TcEgress)
        {
            let what = format!(
                "translated an {} error quoting {quoted:?} to one quoting {got:?} from {} to \
                 {}, by the entry {to:?} (flags {:#x}): the quote must become the entry's \
                 tuple reversed, the error go from {} to {}",
                T::Ip::ICMP.0,
                outer_out.saddr,
                outer_out.daddr,
                e.flags,
                want_outer.0,
                want_outer.1
            );
            self.fail(case, prog, Some(out), &what);
        }
    }

    /// The run counted exactly one outcome, and the one its verdict implies.
    fn check_counted(
        &mut self,
        case: &Case<T::Mutation>,
        prog: Prog,
        o: Outcome,
        out: Option<&[u8]>,
    ) {
        let moved = self.outcomes.moved(prog);
        let fits = match (o, moved.as_slice()) {
            (Outcome::Refused, []) => true,
            (_, [(r, 1)]) => Self::reason_fits(prog, &case.frame, o, *r),
            _ => false,
        };
        if !fits {
            let what = format!(
                "{o:?}, and counted {moved:?}: a run counts one outcome, its own (a pass: {}; a \
                 drop: nat_failed, masq_failed on egress, malformed only once the parser \
                 accepted the packet, whose lengths then hold)",
                T::passes()
            );
            self.fail(case, prog, out, &what);
        }
        if let [(r, _)] = moved.as_slice() {
            let label = Reason::ALL[*r as usize].1;
            *self.stats.progs[prog as usize]
                .outcomes
                .entry(label)
                .or_default() += 1;
        }
    }

    /// Whether a run of `prog` on `input` that ended as `o` may have counted `r`. A drop is
    /// for a flow that gets no unique tuple (`nat_failed`, and `masq_failed` on egress, where
    /// masquerade is), or a rewrite that failed half-way (`malformed`, after the parser
    /// accepted the packet: its lengths held).
    fn reason_fits(prog: Prog, input: &[u8], o: Outcome, r: Reason) -> bool {
        match o {
            Outcome::Translated => r == Reason::Translated,
            Outcome::Dropped => match r {
                Reason::NatFailed => true,
                Reason::Malformed => T::lengths_hold(input),
                Reason::MasqFailed => prog == Prog::TcEgress,
                _ => false,
            },
            Outcome::Passed => T::pass_fits(prog, r),
            Outcome::Refused => false,
        }
    }

    fn summary(&self, packets: usize, secs: f64) {
        let s = &self.stats;
        println!(
            "{}: seed {:#x}, {packets} packets ({} that cannot be for a service), {} runs in \
             {secs:.1} s; tables emptied {} times",
            self.test,
            self.seed,
            s.untouchable,
            s.progs.iter().map(|p| p.runs).sum::<usize>(),
            s.flushes,
        );
        println!(
            "  {:<16}{:>8}{:>15}{:>9}",
            "kind", "clean", "valid-mutated", "garbage"
        );
        let mut kinds: Vec<Kind> = s.packets.keys().map(|(k, _)| *k).collect();
        kinds.dedup();
        for k in kinds {
            let n = |c| s.packets.get(&(k, c)).copied().unwrap_or(0);
            println!(
                "  {:<16}{:>8}{:>15}{:>9}",
                format!("{k:?}"),
                n(Class::Clean),
                n(Class::ValidMutated),
                n(Class::Garbage)
            );
        }
        let muts: Vec<String> = (s.mutations.iter())
            .map(|(m, n)| format!("{m:?} {n}"))
            .collect();
        println!("  mutations: {}", muts.join(", "));
        println!(
            "  {:<11}{:>8}{:>9}{:>12}{:>9}{:>9}{:>11}",
            "program", "runs", "passed", "translated", "dropped", "refused", "sums kept"
        );
        for prog in Prog::ALL {
            let p = &s.progs[prog as usize];
            println!(
                "  {:<11}{:>8}{:>9}{:>12}{:>9}{:>9}{:>11}",
                format!("{prog:?}"),
                p.runs,
                p.passed,
                p.translated,
                p.dropped,
                p.refused,
                p.sums_kept
            );
        }
        let counts = self.f.dp.reasons().unwrap();
        let list = |items: Vec<String>| items.join(", ");
        for prog in Prog::ALL {
            let outcomes = (s.progs[prog as usize].outcomes.iter())
                .map(|(l, n)| format!("{l} {n}"))
                .collect();
            println!(
                "  {prog:?} outcomes (packets that may be for a service): {}",
                list(outcomes)
            );
            let counted = (counts.iter())
                .filter(|(hook, _, n)| *hook == prog.hook() && *n > 0)
                .map(|(_, r, n)| format!("{} {n}", Reason::ALL[*r as usize].1))
                .collect();
            println!("  {prog:?} counted (all packets): {}", list(counted));
            let translated = (s.translated.iter())
                .filter(|((p, _), _)| *p == prog)
                .map(|((_, k), n)| format!("{k:?} {n}"))
                .collect();
            println!("  {prog:?} translated, by kind: {}", list(translated));
        }
        let kept = s.kept.iter().map(|(c, n)| format!("{c} {n}")).collect();
        println!("  checksums kept through a translation: {}", list(kept));
    }

    /// The run must have reached what it is for, so that a generator gone blind fails rather
    /// than passes: every program translated packets with valid checksums and passed others;
    /// every checksum of [`Tier::KEPT`] was kept through a translation; with masquerade
    /// `always`, flows were masqueraded; and what the tier asks besides. (Checked from
    /// [`COVERAGE_FROM`] packets on, where each of these happens dozens of times at least.)
    pub fn assert_coverage(&self) {
        let seed = self.seed;
        for prog in Prog::ALL {
            let p = &self.stats.progs[prog as usize];
            assert!(
                p.sums_kept > 0 && p.passed > 0,
                "{prog:?} translated no packet with valid checksums, or passed none: the \
                 generator no longer reaches it (LB_FUZZ_SEED={seed:#x})"
            );
        }
        T::assert_coverage(self);
        for sum in T::KEPT {
            assert!(
                self.stats.kept.contains_key(sum),
                "no translation re-checked a {sum} checksum (LB_FUZZ_SEED={seed:#x})"
            );
        }
        if self.masquerade == Masquerade::Always {
            assert!(
                reason_count(&self.f, Prog::TcEgress.hook(), Reason::MasqNew) > 0,
                "masquerade `always` masqueraded no flow of {} (LB_FUZZ_SEED={seed:#x})",
                T::Addr::FLOWS
            );
        }
    }

    /// That one of `progs` translated a packet of `kind`.
    pub fn assert_translated(&self, progs: &[Prog], kind: Kind) {
        assert!(
            (progs.iter()).any(|p| self.stats.translated.contains_key(&(*p, kind))),
            "{progs:?} translated no {kind:?} packet (LB_FUZZ_SEED={:#x})",
            self.seed
        );
    }

    /// That `prog` ended a run as `r`.
    pub fn assert_counted(&self, prog: Prog, r: Reason) {
        assert!(
            reason_count(&self.f, prog.hook(), r) > 0,
            "{prog:?} never ended as {r:?}: the generator misses a path (LB_FUZZ_SEED={:#x})",
            self.seed
        );
    }
}
