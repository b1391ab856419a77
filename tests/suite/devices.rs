//! Real devices' payloads, as their projects document them, through the
//! presets (`palletd print-config --preset`), a real Mosquitto and a real
//! SecantusDB: Tasmota (SENSOR with a sensor and an ENERGY object, STATE,
//! LWT), a Zigbee2MQTT lamp and sensor, Shelly Gen2 NotifyStatus and
//! NotifyFullStatus, RFC 8428 SenML packs in JSON and CBOR, an ESPHome
//! state, OPC 10000-14's PubSub JSON examples (metadata with
//! EngineeringUnits, then data), a MessagePack map and
//! Telegraf's line protocol. They
//! arrive while the database is down, palletd is killed with them in its
//! spool, and the replay stores each with its sensor, time, fields and
//! units. A Homie 4 device, whose values and attributes are all retained:
//! its values stored once each (those published before palletd existed
//! too), the copies the broker sends again on subscribe passed over, the
//! `$` attributes skipped.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use bson::{Bson, Document};
use chrono::TimeZone;
use common::*;

/// Every stored sample by sensor (time order), and each sensor's units.
async fn stored(stack: &Stack) -> (BTreeMap<String, Vec<Document>>, BTreeMap<String, Document>) {
    let mut samples: BTreeMap<String, Vec<Document>> = BTreeMap::new();
    let mut units: BTreeMap<String, Document> = BTreeMap::new();
    for b in stack.docs("readings").await {
        let sensor = b.get_str("sensorId").unwrap().to_string();
        if let Ok(u) = b.get_document("units") {
            units.entry(sensor.clone()).or_default().extend(u.clone());
        }
        for s in b.get_array("samples").unwrap() {
            samples
                .entry(sensor.clone())
                .or_default()
                .push(s.as_document().unwrap().clone());
        }
    }
    for v in samples.values_mut() {
        v.sort_by_key(|s| s.get_datetime("ts").unwrap().timestamp_millis());
    }
    (samples, units)
}

fn num(s: &Document, field: &str) -> f64 {
    match s.get(field) {
        Some(Bson::Double(x)) => *x,
        other => panic!("{field}: expected a double, got {other:?} in {s}"),
    }
}

fn ts(s: &Document) -> i64 {
    s.get_datetime("ts").unwrap().timestamp_millis()
}

#[tokio::test]
async fn devices_payloads_are_stored_with_their_sensor_time_fields_and_units() {
    let mut stack = Stack::without_database("devices", |c| {
        [
            "tasmota",
            "zigbee2mqtt",
            "shelly",
            "senml",
            "esphome",
            "opcua",
            "telegraf",
        ]
        .into_iter()
        .fold(c, Config::preset)
        .subscription(&[
            ("topic", "senml-cbor/{sensor}".into()),
            ("format", "senml_cbor".into()),
        ])
        .subscription(&[
            ("topic", "packed/{sensor}".into()),
            ("format", "msgpack".into()),
            ("timestamp_field", "/meta/at".into()),
        ])
    })
    .await;
    // Whole seconds a minute ago: Tasmota writes seconds, in Berlin time.
    let t = (now_ms() - 60_000) / 1000 * 1000;
    let berlin = chrono_tz::Europe::Berlin
        .timestamp_millis_opt(t)
        .unwrap()
        .format("%Y-%m-%dT%H:%M:%S");
    let secs = t as f64 / 1e3;
    let lamp_note = "n".repeat(2000);
    let messages: Vec<(&str, String)> = vec![
        (
            "tele/th1/SENSOR",
            format!(
                r#"{{"Time":"{berlin}","AM2301":{{"Temperature":24.6,"Humidity":58.2}},"TempUnit":"C"}}"#
            ),
        ),
        (
            "tele/plug1/SENSOR",
            format!(
                r#"{{"Time":"{berlin}","ENERGY":{{"TotalStartTime":"2020-12-27T10:51:14","Total":0.003,"Yesterday":0.000,"Today":0.003,"Period":0,"Power":12,"ApparentPower":14,"ReactivePower":6,"Factor":0.85,"Voltage":229,"Current":0.061}}}}"#
            ),
        ),
        (
            "tele/plug1/STATE",
            format!(
                r#"{{"Time":"{berlin}","Uptime":"0T00:15:09","UptimeSec":909,"Heap":26,"SleepMode":"Dynamic","Sleep":50,"LoadAvg":19,"MqttCount":1,"POWER":"ON","Wifi":{{"AP":1,"SSId":"home","BSSId":"AA:BB:CC:DD:EE:FF","Channel":1,"Mode":"11n","RSSI":100,"Signal":-50,"LinkCount":1,"Downtime":"0T00:00:03"}}}}"#
            ),
        ),
        ("tele/plug1/LWT", "Online".into()),
        (
            "zigbee2mqtt/kitchen_lamp",
            format!(
                r#"{{"state":"ON","brightness":254,"color_temp":370,"color":{{"x":0.4573,"y":0.41}},"color_mode":"color_temp","linkquality":120,"note":"{lamp_note}","update":{{"state":"idle","installed_version":16777472,"latest_version":16777472}},"update_available":false}}"#
            ),
        ),
        (
            "zigbee2mqtt/hall_th",
            format!(
                r#"{{"temperature":21.3,"humidity":48,"battery":97,"linkquality":87,"last_seen":"{}"}}"#,
                chrono::DateTime::from_timestamp_millis(t)
                    .unwrap()
                    .to_rfc3339()
            ),
        ),
        (
            "shellyhtg3-e4b063d8a9cc/events/rpc",
            format!(
                r#"{{"src":"shellyhtg3-e4b063d8a9cc","dst":"shellyhtg3-e4b063d8a9cc/events","method":"NotifyStatus","params":{{"ts":{},"temperature:0":{{"id":0,"tC":21.6,"tF":70.9}},"humidity:0":{{"id":0,"rh":45.3}}}}}}"#,
                secs + 0.12
            ),
        ),
        (
            "shellyplusht-b8d61a8b17cc/events/rpc",
            format!(
                r#"{{"src":"shellyplusht-b8d61a8b17cc","dst":"shellyplusht-b8d61a8b17cc/events","method":"NotifyFullStatus","params":{{"ts":{secs},"ble":{{}},"cloud":{{"connected":false}},"devicepower:0":{{"id":0,"battery":{{"V":0.43,"percent":0}},"external":{{"present":true}}}},"ht_ui":{{}},"humidity:0":{{"id":0,"rh":42.2}},"mqtt":{{"connected":true}},"sys":{{"mac":"B8D61A8B17CC","restart_required":false,"time":null,"unixtime":null,"uptime":3,"ram_size":235300,"ram_free":164244,"fs_size":458752,"fs_free":118784,"cfg_rev":10,"kvs_rev":0,"webhook_rev":0,"available_updates":{{}},"wakeup_reason":{{"boot":"deepsleep_wake","cause":"status_update"}},"wakeup_period":600}},"temperature:0":{{"id":0,"tC":19.8,"tF":67.6}},"wifi":{{"sta_ip":"192.168.3.183","status":"got ip","ssid":"winos","rssi":-57}}}}}}"#
            ),
        ),
        // RFC 8428, 5.1.4 (its base time moved to a minute ago).
        (
            "senml/meter1",
            format!(
                r#"[{{"bn":"urn:dev:ow:10e2073a0108006:","bt":{secs},"bu":"A","bver":5,"n":"voltage","u":"V","v":120.1}},{{"n":"current","t":-5,"v":1.2}},{{"n":"current","t":-4,"v":1.3}},{{"n":"current","t":-3,"v":1.4}},{{"n":"current","t":-2,"v":1.5}},{{"n":"current","t":-1,"v":1.6}},{{"n":"current","v":1.7}}]"#
            ),
        ),
        ("greenhouse/sensor/soil_moisture/state", "41.7".into()),
        // OPC 10000-14 A.3.4.5 (its Timestamp moved to a minute ago).
        (
            "opcua/json/data/MyPublisher/G1",
            format!(
                r#"{{"MessageId":"9279c0b3-da88-45a4-af74-451cebf82db0","MessageType":"ua-data","PublisherId":"MyPublisher","Messages":[{{"DataSetWriterId":101,"SequenceNumber":68468,"MinorVersion":672341762,"Timestamp":"{iso}","Payload":{{"Active":true,"Temperature":25.5,"Counter":0,"AdditionalInfo":"The system is running normally (1)"}}}},{{"DataSetWriterId":102,"SequenceNumber":25460,"MinorVersion":672341762,"Timestamp":"{iso}","Status":{{"Code":1073741824}},"Payload":{{"LocationName":"Building A","Coordinate":{{"X":0,"Y":0.2}},"Measurements":[20030,20020,20010]}}}}]}}"#,
                iso = chrono::DateTime::from_timestamp_millis(t)
                    .unwrap()
                    .to_rfc3339()
            ),
        ),
    ];
    let mut p = stack.publisher().await;
    // OPC 10000-14 A.3.2's DataSetMetaData for writer 101, its Temperature
    // with EngineeringUnits (1.05's encoding); spooled before the data
    // (messages on palletd's several connections are taken as they
    // arrive).
    p.publish(
        "opcua/json/metadata/MyPublisher/G1/101",
        r#"{"MessageId":"66D65CA4-92EE-4195-9867-E6E27794B692","MessageType":"ua-metadata","PublisherId":"MyPublisher","DataSetWriterId":101,"MetaData":{"Name":"DataSet1","Fields":[{"Name":"Active","FieldFlags":0,"BuiltInType":1,"DataType":"i=1","ValueRank":-1},{"Name":"Temperature","FieldFlags":0,"BuiltInType":11,"DataType":"i=11","ValueRank":-1,"Properties":[{"Key":"EngineeringUnits","Value":{"UaType":22,"Value":{"UaTypeId":"i=888","UaBody":{"NamespaceUri":"http://www.opcfoundation.org/UA/units/un/cefact","UnitId":4408652,"DisplayName":{"Locale":"en","Text":"°C"}}}}}]}]}}"#,
    )
    .await;
    p.flush().await;
    stack.all_acknowledged().await;
    for (topic, payload) in &messages {
        p.publish(topic, payload.as_bytes().to_vec()).await;
    }
    // RFC 8428 5.1.2 in CBOR (bn -2, bt -3, n 0, u 1, v 2), and a
    // MessagePack map read with JSON's paths.
    use ciborium::Value as C;
    let pack = C::Array(vec![
        C::Map(vec![
            (
                C::Integer((-2).into()),
                C::Text("urn:dev:ow:10e2073a01080063:".into()),
            ),
            (C::Integer((-3).into()), C::Float(secs)),
            (C::Integer(0.into()), C::Text("voltage".into())),
            (C::Integer(1.into()), C::Text("V".into())),
            (C::Integer(2.into()), C::Float(120.1)),
        ]),
        C::Map(vec![
            (C::Integer(0.into()), C::Text("current".into())),
            (C::Integer(1.into()), C::Text("A".into())),
            (C::Integer(2.into()), C::Float(1.2)),
        ]),
    ]);
    let mut cbor = Vec::new();
    ciborium::into_writer(&pack, &mut cbor).unwrap();
    p.publish("senml-cbor/meter2", cbor).await;
    let packed = serde_json::json!({"meta": {"at": t}, "motor": {"rpm": 1480.5, "on": true}});
    p.publish("packed/press7", rmp_serde::to_vec_named(&packed).unwrap())
        .await;
    // Telegraf's cpu plugin in line protocol, nanoseconds.
    let ns = t * 1_000_000;
    p.publish(
        "telegraf/edge1/cpu",
        format!("cpu,cpu=cpu-total,host=edge1 usage_idle=98.2,usage_user=1.1 {ns}\ncpu,cpu=cpu0,host=edge1 usage_idle=97.5,usage_user=2i {ns}\n"),
    )
    .await;
    p.flush().await;
    const SAMPLES: usize = 4 + 2 + 2 + 6 + 1 + 2 + 1 + 1 + 2;
    stack
        .palletd
        .wait_metric("palletd_samples_decoded_total", SAMPLES as f64)
        .await;
    stack.all_acknowledged().await;
    assert_eq!(
        stack.palletd.metric(
            "palletd_fields_dropped_total",
            Some(("cause", "string_too_long"))
        ),
        1.0,
        "the lamp's note is left out, counted"
    );
    assert_eq!(
        stack.palletd.metric("palletd_dead_letters_total", None),
        0.0
    );

    // Killed with everything in the spool; the replay stores it.
    stack.palletd.kill();
    stack.palletd = Palletd::start(&stack.config);
    stack.db.start_again();
    stack.wait_stored(SAMPLES).await;
    let (all, units) = stored(&stack).await;
    assert_eq!(
        all.values().map(Vec::len).sum::<usize>(),
        SAMPLES,
        "{all:?}"
    );
    assert!(stack.docs("readings_deadletter").await.is_empty());

    let th1 = &all["th1"][0];
    assert_eq!(ts(th1), t, "Tasmota's local time read in Berlin time");
    assert_eq!(num(th1, "AM2301%2ETemperature"), 24.6);
    assert_eq!(num(th1, "AM2301%2EHumidity"), 58.2);
    assert!(!th1.contains_key("TempUnit"));
    assert_eq!(
        units["th1"],
        bson::doc! { "AM2301%2ETemperature": "C" },
        "Tasmota's TempUnit once per bucket"
    );
    let plug = &all["plug1"];
    assert_eq!(plug.len(), 3);
    let energy = plug
        .iter()
        .find(|s| s.contains_key("ENERGY%2EPower"))
        .unwrap();
    assert_eq!((ts(energy), num(energy, "ENERGY%2EVoltage")), (t, 229.0));
    assert!(!energy.contains_key("ENERGY%2ETotalStartTime"));
    let state = plug.iter().find(|s| s.contains_key("UptimeSec")).unwrap();
    assert_eq!(state.get_str("POWER"), Ok("ON"));
    assert_eq!(num(state, "Wifi%2ERSSI"), 100.0);
    assert!(!state.contains_key("Wifi%2ESSId"), "not included");
    assert!(plug.iter().any(|s| s.get_str("LWT") == Ok("Online")));

    let lamp = &all["kitchen_lamp"][0];
    assert_eq!(
        (num(lamp, "color%2Ex"), num(lamp, "color%2Ey")),
        (0.4573, 0.41)
    );
    assert_eq!(lamp.get_str("state"), Ok("ON"));
    assert!(!lamp.contains_key("note") && !lamp.contains_key("update%2Estate"));
    assert_eq!(ts(&all["hall_th"][0]), t, "last_seen");

    let ht = &all["shellyhtg3-e4b063d8a9cc"][0];
    assert_eq!(ts(ht), t + 120, "params.ts with its fraction");
    assert_eq!(num(ht, "temperature:0%2EtC"), 21.6);
    assert_eq!(num(ht, "humidity:0%2Erh"), 45.3);
    assert!(!ht.contains_key("temperature:0%2Eid"));
    let full = &all["shellyplusht-b8d61a8b17cc"][0];
    assert_eq!(num(full, "devicepower:0%2Ebattery%2EV"), 0.43);
    assert_eq!(num(full, "sys%2Eram_free"), 164244.0);
    assert!(!full.contains_key("wifi%2Essid") && !full.contains_key("sys%2Emac"));

    let meter = &all["meter1"];
    let offsets: Vec<i64> = meter.iter().map(|s| (ts(s) - t) / 1000).collect();
    assert_eq!(offsets, [-5, -4, -3, -2, -1, 0], "six times");
    assert_eq!(num(&meter[5], "voltage"), 120.1);
    assert_eq!(num(&meter[5], "current"), 1.7);
    assert_eq!(num(&meter[0], "current"), 1.2);
    assert_eq!(
        units["meter1"],
        bson::doc! { "voltage": "V", "current": "A" },
        "units once per bucket"
    );
    assert!(meter.iter().all(|s| !s.contains_key("_units")));
    assert_eq!(num(&all["greenhouse"][0], "soil_moisture"), 41.7);

    let writer = &all["MyPublisher:101"][0];
    assert_eq!((ts(writer), num(writer, "Temperature")), (t, 25.5));
    assert_eq!(
        units["MyPublisher:101"],
        bson::doc! { "Temperature": "°C" },
        "EngineeringUnits from the writer's metadata"
    );
    assert_eq!(writer.get_bool("Active"), Ok(true));
    let writer = &all["MyPublisher:102"][0];
    assert_eq!(num(writer, "StatusCode"), 1_073_741_824.0, "Uncertain kept");
    assert_eq!(num(writer, "Coordinate%2EY"), 0.2);
    assert_eq!(num(writer, "Measurements%2E1"), 20020.0);
    let meter = &all["meter2"][0];
    assert_eq!(
        (ts(meter), num(meter, "voltage"), num(meter, "current")),
        (t, 120.1, 1.2)
    );
    assert_eq!(
        units["meter2"],
        bson::doc! { "voltage": "V", "current": "A" }
    );
    let press = &all["press7"][0];
    assert_eq!((ts(press), num(press, "motor%2Erpm")), (t, 1480.5));
    assert_eq!(press.get_bool("motor%2Eon"), Ok(true));
    let cpu = &all["edge1:cpu"];
    assert_eq!(cpu.len(), 2);
    assert!(cpu.iter().all(|s| ts(s) == t));
    let total = cpu
        .iter()
        .find(|s| s.get_str("cpu") == Ok("cpu-total"))
        .unwrap();
    assert_eq!(num(total, "usage_idle"), 98.2);
}

/// A Homie 4 device, whose values and attributes are all retained: the
/// values it published before palletd existed are stored once (the
/// broker's retained copies are all palletd can have of them), what it
/// publishes later once, and the copies the broker sends again on every
/// subscribe (after a restart, here) nothing; the `$` attributes are
/// skipped.
#[tokio::test]
async fn homie_values_are_stored_once_and_attributes_skipped() {
    let broker = Broker::start();
    let mut device = Publisher::connect(&broker, "super-car").await;
    let retained_before = [
        ("homie/super-car/$homie", "4.0.0"),
        ("homie/super-car/$name", "Super car"),
        ("homie/super-car/$state", "init"),
        ("homie/super-car/$nodes", "engine,lights"),
        ("homie/super-car/engine/$name", "Car engine"),
        ("homie/super-car/engine/$properties", "temperature"),
        ("homie/super-car/engine/temperature/$unit", "°C"),
        ("homie/super-car/engine/temperature/$datatype", "float"),
        ("homie/super-car/engine/temperature", "21.5"),
        ("homie/super-car/lights/on", "false"),
        ("homie/super-car/$state", "ready"),
    ];
    device.retain(&retained_before).await;
    // One connection: a plain subscription, to which every broker sends
    // the retained values (a shared one gets none from Mosquitto 2.0.13 on).
    let mut stack = Stack::on(broker, Database::start(), "homie", |c| {
        c.preset("homie").set("mqtt.connections", 1)
    })
    .await;
    // Sent on subscribe, new to palletd: the temperature, the light, the
    // $state; and the node's two attributes under homie/+/+/+.
    stack.wait_stored(3).await;
    skipped_at_least(&stack.palletd, "metadata", 2.0).await;
    device
        .retain(&[
            ("homie/super-car/engine/temperature", "22.25"),
            ("homie/super-car/engine/$name", "V8 engine"),
            ("homie/super-car/lights/on", "true"),
        ])
        .await;
    stack.wait_stored(5).await;
    stack.all_acknowledged().await;
    // Away: what the device publishes is queued in palletd's session.
    stack.stop();
    device
        .retain(&[
            ("homie/super-car/engine/temperature", "23"),
            ("homie/super-car/$state", "sleeping"),
        ])
        .await;
    stack.palletd = Palletd::start(&stack.config);
    // The session was kept: the two arrive from its queue without the
    // flag, and again, retained, when palletd subscribes on its start with
    // the light's: copies of what palletd took in, passed over.
    stack.wait_stored(7).await;
    skipped_at_least(&stack.palletd, "retained_seen", 3.0).await;
    stack.palletd.settled().await;

    let (all, _) = stored(&stack).await;
    let car = &all["super-car"];
    let mut values: Vec<(&str, Bson)> = car
        .iter()
        .flat_map(|s| s.iter().filter(|(k, _)| *k != "ts"))
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    values.sort_by_key(|(k, v)| format!("{k}{v}"));
    assert_eq!(
        values,
        [
            ("engine/temperature", Bson::Double(21.5)),
            ("engine/temperature", Bson::Double(22.25)),
            ("engine/temperature", Bson::Double(23.0)),
            ("lights/on", Bson::Boolean(false)),
            ("lights/on", Bson::Boolean(true)),
            ("state", Bson::String("ready".into())),
            ("state", Bson::String("sleeping".into())),
        ],
        "{car:?}"
    );
    assert!(stack.docs("readings_deadletter").await.is_empty());
}

/// Waits until palletd passed over at least `n` messages for `reason`.
async fn skipped_at_least(palletd: &Palletd, reason: &str, n: f64) {
    palletd
        .wait_until(Duration::from_secs(30), "messages passed over", |p| {
            p.metric("palletd_messages_skipped_total", Some(("reason", reason))) >= n
        })
        .await;
}
