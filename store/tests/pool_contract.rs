//! The pool roles (`MembershipStore`, `PoolUpdateStore`, `DrainStore`): leases with one holder, heartbeats of live workers, drain
//! reports with the readers' heartbeats.
//! Each test runs on both backends (`contract/mod.rs`).
#![allow(clippy::unwrap_used, missing_docs)]

#[macro_use]
mod contract;
use contract::*;

/// Drain reports are per flow and worker, last report wins, come with the reader's latest
/// heartbeat (none once it left the pool), and go when withdrawn or when the flow is reset.
async fn drain_reports_come_with_the_readers_heartbeats(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    let beat = |worker: &str| WorkerBeat {
        pipeline: "p".into(),
        worker: worker.into(),
        host: "h".into(),
        pid: 1,
        schedule: None,
    };
    store.heartbeat(&beat("a")).await.unwrap();
    store.report_drain(&flows[0], "a", false).await.unwrap();
    store.report_drain(&flows[0], "b", false).await.unwrap();
    store.report_drain(&flows[0], "a", true).await.unwrap();
    store.report_drain(&flows[1], "c", false).await.unwrap();
    let census = store.drain_census(&flows[0]).await.unwrap();
    assert!(
        (census.now_ms - now_ms()).abs() < 60_000,
        "store clock {}",
        census.now_ms
    );
    let seen: Vec<(&str, bool, bool)> = census
        .reports
        .iter()
        .map(|r| (r.worker.as_str(), r.drained, r.last_beat_ms.is_some()))
        .collect();
    assert_eq!(seen, [("a", true, true), ("b", false, false)]);
    assert!(census.reports[0].reported_at_ms <= census.now_ms);
    store.withdraw_drain(&flows[0], "a").await.unwrap();
    assert_eq!(
        store.drain_census(&flows[0]).await.unwrap().reports.len(),
        1
    );
    store
        .reset_flow(&flows[1], Some("p__events"), ResetRows::All, None)
        .await
        .unwrap();
    let flows = store.prepare(&layout(&["live", "other"])).await.unwrap();
    assert!(
        store
            .drain_census(&flows[1])
            .await
            .unwrap()
            .reports
            .is_empty()
    );
}

async fn leases_have_one_holder_and_move_when_they_expire(postgres: bool) {
    let (_place, store, _flows) = open(postgres).await;
    let grant = store.acquire_lease(&lease("w1", 700)).await.unwrap();
    assert!(
        matches!(grant, LeaseGrant::Held { taken: true, .. }),
        "{grant:?}"
    );
    // Held: another worker is refused, the holder renews without "taking" it again.
    assert_eq!(
        store.acquire_lease(&lease("w2", 700)).await.unwrap(),
        LeaseGrant::HeldBy("w1".into())
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let renewed = store.acquire_lease(&lease("w1", 700)).await.unwrap();
    assert!(
        matches!(renewed, LeaseGrant::Held { taken: false, .. }),
        "{renewed:?}"
    );
    // The holder stops renewing: after the ttl, w2 takes it.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let taken = store.acquire_lease(&lease("w2", 700)).await.unwrap();
    assert!(
        matches!(taken, LeaseGrant::Held { taken: true, .. }),
        "{taken:?}"
    );
    assert_eq!(
        store.acquire_lease(&lease("w1", 700)).await.unwrap(),
        LeaseGrant::HeldBy("w2".into())
    );
    // A clean release hands it over at once.
    store
        .release_lease("p", "ledger_upkeep", "w2")
        .await
        .unwrap();
    let back = store.acquire_lease(&lease("w1", 700)).await.unwrap();
    assert!(
        matches!(back, LeaseGrant::Held { taken: true, .. }),
        "{back:?}"
    );
    let leases = store.leases("p").await.unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].holder, "w1");
}

async fn heartbeats_list_live_workers(postgres: bool) {
    let (_place, store, _flows) = open(postgres).await;
    let beat = |worker: &str| WorkerBeat {
        pipeline: "p".into(),
        worker: worker.into(),
        host: "h".into(),
        pid: 7,
        schedule: Some(format!("schedule of {worker}")),
    };
    store.heartbeat(&beat("old")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    store.heartbeat(&beat("new")).await.unwrap();
    let recent = store
        .workers("p", Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(
        recent.iter().map(|w| w.worker.as_str()).collect::<Vec<_>>(),
        vec!["new"]
    );
    let all = store.workers("p", Duration::from_secs(60)).await.unwrap();
    assert_eq!(all.len(), 2);
    assert!(all.iter().all(|w| w.last_beat_ms >= w.started_at_ms));
    assert_eq!(
        all.iter()
            .map(|w| w.schedule.as_deref())
            .collect::<Vec<_>>(),
        [Some("schedule of new"), Some("schedule of old")],
        "each worker's schedule, as it last beat"
    );
    store
        .heartbeat(&WorkerBeat {
            schedule: None,
            ..beat("old")
        })
        .await
        .unwrap();
    let all = store.workers("p", Duration::from_secs(60)).await.unwrap();
    assert_eq!(all[1].schedule, None, "a beat replaces the schedule");
    store.leave("p", "new").await.unwrap();
    let left = store.workers("p", Duration::from_secs(60)).await.unwrap();
    assert_eq!(
        left.iter().map(|w| w.worker.as_str()).collect::<Vec<_>>(),
        vec!["old"]
    );
}

/// Pool updates: the oldest unfinished one is found, drain reports are listed once, one
/// claimer at a time (a claim older than `stale_after` is taken over, the holder renews its
/// own), an update ends once and is never rewritten, the newest is found ended or not.
async fn pool_updates_are_claimed_once_and_end_once(postgres: bool) {
    let (_place, store, _flows) = open(postgres).await;
    assert_eq!(store.pool_update("p", None).await.unwrap(), None);
    assert_eq!(store.latest_pool_update("p").await.unwrap(), None);
    let first = store
        .request_pool_update("p", r#"{"Refresh":["a"]}"#, "w1")
        .await
        .unwrap();
    let second = store.request_pool_update("p", "{}", "w2").await.unwrap();
    store
        .request_pool_update("other", "{}", "w9")
        .await
        .unwrap();
    assert!(second > first);
    let open = store.pool_update("p", None).await.unwrap().unwrap();
    assert_eq!((open.id, open.state.name()), (first, "pending"));
    assert_eq!(open.requested_by, "w1");
    for worker in ["w2", "w1", "w2"] {
        store
            .drained_for_pool_update("p", first, worker)
            .await
            .unwrap();
    }
    let open = store.pool_update("p", Some(first)).await.unwrap().unwrap();
    assert_eq!(open.drained, ["w1", "w2"]);
    let long = Duration::from_secs(60);
    assert!(
        store
            .claim_pool_update("p", first, "w1", long)
            .await
            .unwrap()
    );
    assert!(
        !store
            .claim_pool_update("p", first, "w2", long)
            .await
            .unwrap()
    );
    assert!(
        store
            .claim_pool_update("p", first, "w1", long)
            .await
            .unwrap(),
        "renewed"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        store
            .claim_pool_update("p", first, "w2", Duration::from_millis(1))
            .await
            .unwrap(),
        "a stale claim is taken over"
    );
    let clearing = store.pool_update("p", Some(first)).await.unwrap().unwrap();
    assert!(matches!(
        clearing.state,
        sluice_store::PoolUpdateState::Clearing { ref by, .. } if by == "w2"
    ));
    assert!(
        !store
            .finish_pool_update("p", first, "w1", false, "stale")
            .await
            .unwrap(),
        "a clearer whose claim was taken over cannot end the update"
    );
    assert!(
        store
            .finish_pool_update("p", first, "w2", true, "cleared: a")
            .await
            .unwrap()
    );
    assert!(
        !store
            .finish_pool_update("p", first, "w2", false, "late")
            .await
            .unwrap()
    );
    assert!(
        !store
            .claim_pool_update("p", first, "w1", long)
            .await
            .unwrap()
    );
    let done = store.pool_update("p", Some(first)).await.unwrap().unwrap();
    assert_eq!(done.state, sluice_store::PoolUpdateState::Done);
    assert_eq!(done.message.as_deref(), Some("cleared: a"));
    assert_eq!(
        store.pool_update("p", None).await.unwrap().unwrap().id,
        second
    );
    assert!(
        !store
            .finish_pool_update("p", second, "w1", false, "withdrawn")
            .await
            .unwrap(),
        "withdrawn only once claimed"
    );
    assert!(
        store
            .claim_pool_update("p", second, "w1", long)
            .await
            .unwrap()
    );
    assert!(
        store
            .finish_pool_update("p", second, "w1", false, "withdrawn")
            .await
            .unwrap()
    );
    assert_eq!(store.pool_update("p", None).await.unwrap(), None);
    let latest = store.latest_pool_update("p").await.unwrap().unwrap();
    assert_eq!((latest.id, latest.state.name()), (second, "failed"));
}

/// A reset made under a pool update's claim deletes only while its clearer holds the claim:
/// once another took it over, the paused clearer's reset deletes nothing.
async fn a_reset_under_a_lost_claim_deletes_nothing(postgres: bool) {
    let (_place, store, flows) = open(postgres).await;
    store
        .commit(batch(&flows[1], vec![row("k1"), row("k2")]))
        .await
        .unwrap();
    let id = store.request_pool_update("p", "{}", "w1").await.unwrap();
    let long = Duration::from_secs(60);
    assert!(store.claim_pool_update("p", id, "w1", long).await.unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        store
            .claim_pool_update("p", id, "w2", Duration::from_millis(1))
            .await
            .unwrap(),
        "w1 was paused past its claim: w2 takes it over"
    );
    let stale = sluice_store::ClearClaim {
        update: id,
        clearer: "w1".into(),
    };
    let refused = store
        .reset_flow(&flows[1], Some("p__events"), ResetRows::All, Some(&stale))
        .await;
    assert!(
        matches!(refused, Err(StoreError::ClaimLost(_))),
        "{refused:?}"
    );
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 2);
    let held = sluice_store::ClearClaim {
        update: id,
        clearer: "w2".into(),
    };
    store
        .reset_flow(&flows[1], Some("p__events"), ResetRows::All, Some(&held))
        .await
        .unwrap();
    assert_eq!(store.count_rows("p__events", None).await.unwrap(), 0);
    assert!(
        store
            .finish_pool_update("p", id, "w2", true, "done")
            .await
            .unwrap()
    );
    let ended = store
        .reset_flow(&flows[1], Some("p__events"), ResetRows::All, Some(&held))
        .await;
    assert!(matches!(ended, Err(StoreError::ClaimLost(_))), "{ended:?}");
}

/// A store whose `sluice_workers` is from before schedules were compared gains the column when
/// it opens, and its heartbeats carry the schedule.
async fn workers_from_before_schedules_are_upgraded(postgres: bool) {
    let place = Place::new(postgres).await;
    let store = place.open();
    store.prepare(&layout(&["live"])).await.unwrap();
    let (time, undo) = if postgres {
        (
            "TIMESTAMPTZ",
            "DELETE FROM sluice_migrations WHERE version >= 16;",
        )
    } else {
        ("INTEGER", "")
    };
    place
        .execute(&format!(
            "DROP TABLE sluice_workers;
             CREATE TABLE sluice_workers (
                 pipeline TEXT NOT NULL, worker TEXT NOT NULL, host TEXT NOT NULL,
                 pid INTEGER NOT NULL, started_at {time} NOT NULL, last_beat {time} NOT NULL,
                 PRIMARY KEY (pipeline, worker));
             {undo}"
        ))
        .await;
    drop(store);
    let store = place.open();
    store.prepare(&layout(&["live"])).await.unwrap();
    let beat = WorkerBeat {
        pipeline: "p".into(),
        worker: "w".into(),
        host: "h".into(),
        pid: 1,
        schedule: Some("every 5 s".into()),
    };
    store.heartbeat(&beat).await.unwrap();
    let alive = store.workers("p", Duration::from_secs(60)).await.unwrap();
    assert_eq!(alive.len(), 1);
    assert_eq!(alive[0].schedule.as_deref(), Some("every 5 s"));
}

on_both_backends!(
    workers_from_before_schedules_are_upgraded,
    a_reset_under_a_lost_claim_deletes_nothing,
    pool_updates_are_claimed_once_and_end_once,
    drain_reports_come_with_the_readers_heartbeats,
    leases_have_one_holder_and_move_when_they_expire,
    heartbeats_list_live_workers,
);
