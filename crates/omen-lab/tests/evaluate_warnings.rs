//! `omen evaluate-warnings` end to end on short scenarios: a slow KVF creep and a
//! healthy replica at a coarse step, and an abrupt model change at 60 s, simulated and
//! replayed through the real pipeline, scored against the targets.

use omen_agent::config::Config;
use omen_lab::evaluate_warnings::{
    evaluate, table, EvaluateOptions, TARGET_DETECTION_MINUTES, TARGET_FALSE_ALARMS_PER_WEEK,
    TARGET_LEAD_DAYS,
};

const CREEP: &str = "name: creep\nseed: 11\ndays: 36\nstep: 30m\n\
                     fault: {kind: kv_fragmentation_creep, onset_days: 2, magnitude: 0.025}\n";
const HEALTHY: &str = "name: healthy\nseed: 12\ndays: 28\nstep: 30m\n";

#[test]
fn short_scenarios_meet_the_warning_targets() {
    let dir = tempfile::tempdir().unwrap();
    let scenarios = dir.path().join("scenarios");
    std::fs::create_dir(&scenarios).unwrap();
    for (file, text) in [
        ("creep.yaml", CREEP),
        ("healthy.yaml", HEALTHY),
        (
            "decay.yaml",
            "name: decay\nseed: 13\ndays: 2\nstep: 60s\n\
             fault: {kind: consistency_decay, onset_days: 1.3, magnitude: 0.5}\n",
        ),
    ] {
        std::fs::write(scenarios.join(file), text).unwrap();
    }
    let report =
        evaluate(&Config::default(), &scenarios, &dir.path().join("work"), EvaluateOptions::default())
            .unwrap();
    println!("{}", table(&report));
    let by_name = |n: &str| report.scenarios.iter().find(|r| r.scenario == n).unwrap();

    let creep = by_name("creep");
    let breach = creep.labels.breach_ts_ms.expect("the creep breaches kvf within the trace");
    let warning = creep.first_warning_ts_ms.expect("an early warning for kvf");
    assert!(warning < breach, "{:?}", creep.events);
    // The early warning fires when the forecast breach is within 14 days plus one (the daily
    // values move once a day) and the slope interval points towards it: on a clean linear
    // drift the lead is at least 14 days (the pipeline measures 14.3 here).
    let lead = creep.lead_days.unwrap();
    assert!(lead >= TARGET_LEAD_DAYS, "lead {lead}");
    assert_eq!(report.summary.lead_target_met, lead >= TARGET_LEAD_DAYS);
    assert_eq!(creep.false_alarms, 0, "{:?}", creep.events);
    // The report keeps what the first warning said: within a day of the lead it gave.
    let said = creep.warned_days_to_breach.expect("the warning carries its forecast");
    assert!(said > 0.0 && said <= TARGET_LEAD_DAYS + 1.0, "said {said} days");
    assert!((said - lead).abs() <= 1.0, "said {said} days, lead {lead}");

    let healthy = by_name("healthy");
    assert!(healthy.false_alarms_per_week <= TARGET_FALSE_ALARMS_PER_WEEK, "{:?}", healthy.events);

    let decay = by_name("decay");
    let delay = decay.detection_minutes.expect("the model change is flagged");
    assert!((0.0..=TARGET_DETECTION_MINUTES).contains(&delay), "{delay} min: {:?}", decay.events);

    let s = &report.summary;
    assert!(s.false_alarm_target_met && s.detection_target_met, "{s:?}");
    assert!(dir.path().join("work/creep/labels.json").exists());
}

#[test]
fn several_seeds_give_a_lead_distribution_and_parallel_runs_match_serial_ones() {
    let dir = tempfile::tempdir().unwrap();
    let scenarios = dir.path().join("scenarios");
    std::fs::create_dir(&scenarios).unwrap();
    std::fs::write(scenarios.join("creep.yaml"), CREEP).unwrap();
    std::fs::write(scenarios.join("healthy.yaml"), HEALTHY).unwrap();
    let run = |jobs: usize, work: &str| {
        evaluate(
            &Config::default(),
            &scenarios,
            &dir.path().join(work),
            EvaluateOptions { seeds: 3, jobs, baseline: false },
        )
        .unwrap()
    };
    let parallel = run(3, "parallel");
    println!("{}", table(&parallel));
    let seeds: Vec<(String, u64)> = parallel.scenarios.iter().map(|r| (r.scenario.clone(), r.seed)).collect();
    let expected: Vec<(String, u64)> =
        [("creep", 11), ("creep", 12), ("creep", 13), ("healthy", 12), ("healthy", 13), ("healthy", 14)]
            .iter()
            .map(|(n, s)| ((*n).to_owned(), *s))
            .collect();
    assert_eq!(seeds, expected);
    assert!(dir.path().join("parallel/creep@13/labels.json").exists());

    // Other seeds are other traces: the breach moves with the noise.
    let creeps: Vec<_> = parallel.scenarios.iter().filter(|r| r.scenario == "creep").collect();
    assert!(
        creeps
            .iter()
            .any(|r| r.labels.breach_ts_ms != creeps[0].labels.breach_ts_ms
                || r.lead_days != creeps[0].lead_days),
        "three seeds gave the same run: {creeps:?}"
    );
    let leads: Vec<f64> = creeps.iter().map(|r| r.lead_days.expect("each seed is warned")).collect();

    let agg = &parallel.by_scenario[0];
    assert_eq!((agg.scenario.as_str(), agg.runs, agg.missed), ("creep", 3, 0));
    let (lo, hi) = (agg.min_lead_days.unwrap(), agg.max_lead_days.unwrap());
    assert_eq!(lo, leads.iter().copied().fold(f64::INFINITY, f64::min));
    assert_eq!(hi, leads.iter().copied().fold(f64::NEG_INFINITY, f64::max));
    assert!((lo..=hi).contains(&agg.median_lead_days.unwrap()));
    assert_eq!(parallel.by_scenario[1].median_lead_days, None, "a healthy trace has no lead");
    assert_eq!(parallel.summary.slow_drift_runs, 3);
    assert_eq!(parallel.summary.median_lead_days, agg.median_lead_days);

    // Replays are independent: three at once give what one at a time gives.
    let serial = run(1, "serial");
    let key = |r: &omen_lab::evaluate_warnings::Report| {
        r.scenarios.iter().map(|s| (s.seed, s.lead_days, s.false_alarms, s.events.len())).collect::<Vec<_>>()
    };
    assert_eq!(key(&parallel), key(&serial));
}

/// The baseline is computed by the real Prometheus (promtool backfills the trace and the
/// recording rules; the alert is queried hour by hour) and scored by the same rules.
#[test]
fn the_predict_linear_baseline_is_scored_from_the_real_prometheus() {
    let dir = tempfile::tempdir().unwrap();
    let scenarios = dir.path().join("scenarios");
    std::fs::create_dir(&scenarios).unwrap();
    std::fs::write(scenarios.join("creep.yaml"), CREEP).unwrap();
    std::fs::write(scenarios.join("healthy.yaml"), HEALTHY).unwrap();
    let options = EvaluateOptions { seeds: 1, jobs: 1, baseline: true };
    let report = evaluate(&Config::default(), &scenarios, &dir.path().join("work"), options).unwrap();
    let printed = table(&report);
    println!("{printed}");
    assert!(printed.contains("baseline, Prometheus predict_linear"), "{printed}");
    let creep = report.scenarios.iter().find(|r| r.scenario == "creep").unwrap();
    let baseline = creep.baseline.as_ref().expect("the baseline ran");
    // A clean linear creep: predict_linear over the recorded daily p95 warns before the
    // breach too, and its alert events name the expression Prometheus evaluated.
    let lead = baseline.lead_days.unwrap_or_else(|| panic!("{:?}", baseline.events));
    assert!(lead > 7.0 && lead < 25.0, "lead {lead}: {:?}", baseline.events);
    let first = baseline.events.iter().find(|e| e.alert == "forecast:kvf").unwrap();
    assert!(
        first
            .reason
            .starts_with("predict_linear(slo:omen_kv_fragmentation:max_kvf_1d[7d], 14 * 86400) > 1.8"),
        "{first:?}"
    );
    // The recording rules and the TSDB stay in the run's folder for inspection.
    assert!(dir.path().join("work/creep/baseline/rules.yml").exists());
    let summary = report.baseline_summary.as_ref().unwrap();
    assert_eq!(summary.slow_drift_runs, 1);
    assert!(summary.healthy_false_alarms_per_week.is_some());
}
