//! Presets: the `[[subscription]]` blocks for a family of devices, as a
//! starting configuration the operator reads and changes
//! (`palletd print-config --preset tasmota` prints the example
//! configuration with them in place of its own subscriptions). Nothing of
//! a preset is applied behind the configuration's back.

/// Each preset's name and its subscriptions (the files in `presets/`).
pub const PRESETS: &[(&str, &str)] = &[
    ("tasmota", include_str!("../../presets/tasmota.toml")),
    (
        "zigbee2mqtt",
        include_str!("../../presets/zigbee2mqtt.toml"),
    ),
    ("shelly", include_str!("../../presets/shelly.toml")),
    ("esphome", include_str!("../../presets/esphome.toml")),
    ("homie", include_str!("../../presets/homie.toml")),
    (
        "homeassistant",
        include_str!("../../presets/homeassistant.toml"),
    ),
    ("senml", include_str!("../../presets/senml.toml")),
    ("opcua", include_str!("../../presets/opcua.toml")),
    ("telegraf", include_str!("../../presets/telegraf.toml")),
];

/// The example configuration's line that starts its subscriptions.
const SUBSCRIPTIONS: &str = "# One or more subscriptions.";

/// A preset's subscriptions by name.
pub fn preset(name: &str) -> Result<&'static str, String> {
    PRESETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| *text)
        .ok_or_else(|| {
            let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
            crate::decode::not_one_of(&names, name)
        })
}

/// The example configuration with a preset's subscriptions in place of
/// its own.
pub fn example_with(name: &str) -> Result<String, String> {
    let subscriptions = preset(name)?;
    let head = super::EXAMPLE
        .find(SUBSCRIPTIONS)
        .map_or(super::EXAMPLE, |at| &super::EXAMPLE[..at]);
    Ok(format!("{head}{subscriptions}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{Decoded, Decoder, FieldValue, Reading};

    fn decoder(name: &str) -> Decoder {
        let text = example_with(name).unwrap();
        let settings = super::super::parse(&text, None)
            .unwrap_or_else(|e| panic!("preset {name} does not parse: {e:?}"));
        Decoder::new(settings.subscriptions.clone(), settings.decode_limits())
    }

    fn decode(name: &str, topic: &str, payload: &str, now_ms: i64) -> Decoded {
        decoder(name).decode(topic, payload.as_bytes(), now_ms)
    }

    fn field<'a>(r: &'a Reading, name: &str) -> Option<&'a FieldValue> {
        r.fields.iter().find(|f| f.0 == name).map(|f| &f.1)
    }

    fn num(r: &Reading, name: &str) -> f64 {
        match field(r, name) {
            Some(FieldValue::Num(x)) => *x,
            other => panic!("{name}: {other:?} in {r:?}"),
        }
    }

    /// 2026-12-03T09:45:00Z.
    const NOW: i64 = 1_796_291_100_000;

    #[test]
    fn every_preset_parses_and_names_itself() {
        for (name, text) in PRESETS {
            let full = example_with(name).unwrap();
            assert!(full.ends_with(text), "{name}");
            assert!(!full.contains("sensors/{sensor}/telemetry"), "{name}");
            decoder(name);
        }
        assert!(preset("nope").unwrap_err().contains("\"tasmota\""));
    }

    /// Tasmota's own examples (the AM2301 page, an ENERGY plug, a STATE
    /// and the LWT), its local time read in the preset's zone.
    #[test]
    fn tasmota() {
        let d = decode(
            "tasmota",
            "tele/th1/SENSOR",
            r#"{"Time":"2026-12-03T10:44:30","AM2301":{"Temperature":24.6,"Humidity":58.2},"TempUnit":"C"}"#,
            NOW,
        );
        assert!(d.errors.is_empty() && d.dropped.is_empty(), "{d:?}");
        let r = &d.readings[0];
        assert_eq!((r.sensor.as_str(), r.ts_ms), ("th1", NOW - 30_000));
        assert_eq!(num(r, "AM2301%2ETemperature"), 24.6);
        assert_eq!(num(r, "AM2301%2EHumidity"), 58.2);
        assert_eq!(field(r, "TempUnit"), None, "a unit, not a field");
        assert_eq!(
            r.units,
            [("AM2301%2ETemperature".to_string(), "C".to_string())]
        );
        let d = decode(
            "tasmota",
            "tele/plug1/SENSOR",
            r#"{"Time":"2026-12-03T10:44:00","ENERGY":{"TotalStartTime":"2020-12-27T10:51:14","Total":0.003,"Yesterday":0.000,"Today":0.003,"Period":0,"Power":12,"ApparentPower":14,"ReactivePower":6,"Factor":0.85,"Voltage":229,"Current":0.061}}"#,
            NOW,
        );
        let r = &d.readings[0];
        assert_eq!(num(r, "ENERGY%2EPower"), 12.0);
        assert_eq!(num(r, "ENERGY%2EVoltage"), 229.0);
        assert_eq!(field(r, "ENERGY%2ETotalStartTime"), None, "excluded");
        assert_eq!(r.fields.len(), 10);
        let d = decode(
            "tasmota",
            "tele/plug1/STATE",
            r#"{"Time":"2026-12-03T10:44:00","Uptime":"0T00:15:09","UptimeSec":909,"Heap":26,"SleepMode":"Dynamic","Sleep":50,"LoadAvg":19,"MqttCount":1,"POWER":"ON","Wifi":{"AP":1,"SSId":"home","BSSId":"AA:BB:CC:DD:EE:FF","Channel":1,"Mode":"11n","RSSI":100,"Signal":-50,"LinkCount":1,"Downtime":"0T00:00:03"}}"#,
            NOW,
        );
        let r = &d.readings[0];
        let names: Vec<&str> = r.fields.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "UptimeSec",
                "Heap",
                "LoadAvg",
                "MqttCount",
                "POWER",
                "Wifi%2ERSSI",
                "Wifi%2ESignal",
                "Wifi%2ELinkCount"
            ]
        );
        let d = decode("tasmota", "tele/plug1/LWT", "Offline", NOW);
        assert_eq!(
            d.readings[0].fields,
            [("LWT".to_string(), FieldValue::Str("Offline".into()))]
        );
    }

    /// Summer time: the same wall clock is an hour earlier in UTC; the hour
    /// a clock change skips is refused, the one it repeats taken early.
    #[test]
    fn local_time_follows_the_zones_rules() {
        let at = |time: &str, now: i64| {
            decode(
                "tasmota",
                "tele/th1/SENSOR",
                &format!(r#"{{"Time":"{time}","AM2301":{{"Temperature":1}}}}"#),
                now,
            )
        };
        // 2026-07-01T10:00:00Z.
        let july = 1_782_900_000_000;
        assert_eq!(at("2026-07-01T12:00:00", july).readings[0].ts_ms, july);
        // 2026-03-29 02:30 does not exist in Berlin; 2026-10-25 02:30 twice.
        let march = 1_774_747_800_000; // 2026-03-29T01:30:00Z
        let skipped = at("2026-03-29T02:30:00", march);
        assert_eq!(skipped.errors[0].cause(), "bad_timestamp", "{skipped:?}");
        let october = 1_792_888_200_000; // 2026-10-25T00:30:00Z (CEST)
        assert_eq!(
            at("2026-10-25T02:30:00", october + 3_600_000).readings[0].ts_ms,
            october
        );
    }

    /// A lamp as Zigbee2MQTT documents its state: the whole message
    /// stored, color flattened, the update state left out.
    #[test]
    fn zigbee2mqtt_lamp() {
        let d = decode(
            "zigbee2mqtt",
            "zigbee2mqtt/kitchen_lamp",
            r#"{"state":"ON","brightness":254,"color_temp":370,"color":{"x":0.4573,"y":0.41},"color_mode":"color_temp","linkquality":120,"update":{"state":"idle","installed_version":16777472,"latest_version":16777472},"update_available":false}"#,
            NOW,
        );
        assert!(d.errors.is_empty(), "{d:?}");
        let r = &d.readings[0];
        assert_eq!((r.sensor.as_str(), r.ts_ms), ("kitchen_lamp", NOW));
        assert_eq!(num(r, "color%2Ex"), 0.4573);
        assert_eq!(num(r, "color%2Ey"), 0.41);
        assert_eq!(num(r, "brightness"), 254.0);
        assert!(r.fields.iter().all(|f| !f.0.starts_with("update")), "{r:?}");
        // last_seen (advanced.last_seen = "ISO_8601") is the time.
        let d = decode(
            "zigbee2mqtt",
            "zigbee2mqtt/th",
            r#"{"temperature":21.3,"humidity":48,"battery":97,"last_seen":"2026-12-03T10:44:50+01:00"}"#,
            NOW,
        );
        assert_eq!(d.readings[0].ts_ms, NOW - 10_000);
        // The bridge's topics are not matched.
        assert_eq!(
            decode(
                "zigbee2mqtt",
                "zigbee2mqtt/bridge/state",
                r#"{"state":"online"}"#,
                NOW
            )
            .errors[0]
                .cause(),
            "unknown_topic"
        );
    }

    /// Shelly's NotifyStatus and a Plus H&T's NotifyFullStatus: the
    /// components under params are fields, params.ts (with its fraction)
    /// the time.
    #[test]
    fn shelly_gen2() {
        let ts = 1_796_291_090.12_f64;
        let d = decode(
            "shelly",
            "shellyhtg3-e4b063d8a9cc/events/rpc",
            &format!(
                r#"{{"src":"shellyhtg3-e4b063d8a9cc","dst":"shellyhtg3-e4b063d8a9cc/events","method":"NotifyStatus","params":{{"ts":{ts},"temperature:0":{{"id":0,"tC":21.6,"tF":70.9}},"humidity:0":{{"id":0,"rh":45.3}}}}}}"#
            ),
            NOW,
        );
        assert!(d.errors.is_empty(), "{d:?}");
        let r = &d.readings[0];
        assert_eq!(r.sensor, "shellyhtg3-e4b063d8a9cc");
        assert_eq!(r.ts_ms, NOW - 9_880);
        let names: Vec<&str> = r.fields.iter().map(|f| f.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "temperature:0%2EtC",
                "temperature:0%2EtF",
                "humidity:0%2Erh"
            ]
        );
        assert_eq!(num(r, "humidity:0%2Erh"), 45.3);
        let full = r#"{"src":"shellyplusht-b8d61a8b17cc","dst":"shellyplusht-b8d61a8b17cc/events","method":"NotifyFullStatus","params":{"ts":1680962879.62,"ble":{},"cloud":{"connected":false},"devicepower:0":{"id":0,"battery":{"V":0.43,"percent":0},"external":{"present":true}},"ht_ui":{},"humidity:0":{"id":0,"rh":42.2},"mqtt":{"connected":true},"sys":{"mac":"B8D61A8B17CC","restart_required":false,"time":null,"unixtime":null,"uptime":3,"ram_size":235300,"ram_free":164244,"fs_size":458752,"fs_free":118784,"cfg_rev":10,"kvs_rev":0,"webhook_rev":0,"available_updates":{},"wakeup_reason":{"boot":"deepsleep_wake","cause":"status_update"},"wakeup_period":600},"temperature:0":{"id":0,"tC":19.8,"tF":67.6},"wifi":{"sta_ip":"192.168.3.183","status":"got ip","ssid":"winos","rssi":-57}}}"#;
        let d = decode(
            "shelly",
            "shellyplusht-b8d61a8b17cc/events/rpc",
            full,
            1_680_962_880_000,
        );
        assert!(d.errors.is_empty() && d.dropped.is_empty(), "{d:?}");
        let r = &d.readings[0];
        assert_eq!(r.ts_ms, 1_680_962_879_620);
        assert_eq!(num(r, "temperature:0%2EtC"), 19.8);
        assert_eq!(num(r, "devicepower:0%2Ebattery%2EV"), 0.43);
        assert_eq!(num(r, "wifi%2Erssi"), -57.0);
        for gone in [
            "sys%2Emac",
            "wifi%2Essid",
            "cloud%2Econnected",
            "humidity:0%2Eid",
        ] {
            assert_eq!(field(r, gone), None, "{gone}");
        }
    }

    /// ESPHome's and Home Assistant statestream's one value per topic.
    #[test]
    fn one_value_per_topic() {
        let d = decode(
            "esphome",
            "greenhouse/sensor/soil_moisture/state",
            "41.7",
            NOW,
        );
        assert_eq!(
            (d.readings[0].sensor.as_str(), &d.readings[0].fields),
            (
                "greenhouse",
                &vec![("soil_moisture".to_string(), FieldValue::Num(41.7))]
            )
        );
        let d = decode("esphome", "greenhouse/binary_sensor/door/state", "ON", NOW);
        assert_eq!(d.readings[0].fields[0].1, FieldValue::Str("ON".into()));
        let d = decode(
            "homeassistant",
            "homeassistant/statestream/sensor/kitchen_temperature/unit_of_measurement",
            "\"°C\"",
            NOW,
        );
        assert_eq!(
            d.readings[0].fields,
            [(
                "unit_of_measurement".to_string(),
                FieldValue::Str("°C".into())
            )]
        );
        let d = decode(
            "homeassistant",
            "homeassistant/statestream/sensor/kitchen_temperature/state",
            "21.5",
            NOW,
        );
        assert_eq!(d.readings[0].sensor, "kitchen_temperature");
        assert_eq!(d.readings[0].fields[0].1, FieldValue::Num(21.5));
    }

    /// Homie 4: the specification's own example device, its values and
    /// its attributes.
    #[test]
    fn homie() {
        let d = decode("homie", "homie/super-car/engine/temperature", "21.5", NOW);
        assert_eq!(
            (d.readings[0].sensor.as_str(), &d.readings[0].fields),
            (
                "super-car",
                &vec![("engine/temperature".to_string(), FieldValue::Num(21.5))]
            )
        );
        let d = decode("homie", "homie/super-car/lights/on", "true", NOW);
        assert_eq!(d.readings[0].fields[0].1, FieldValue::Bool(true));
        let d = decode("homie", "homie/super-car/$state", "ready", NOW);
        assert_eq!(
            d.readings[0].fields,
            [("state".to_string(), FieldValue::Str("ready".into()))]
        );
        // Attributes under the subscribed filter homie/+/+/+.
        for topic in [
            "homie/super-car/engine/$name",
            "homie/super-car/engine/$properties",
            "homie/super-car/$stats/uptime",
        ] {
            let d = decode("homie", topic, "Car engine", NOW);
            assert!(
                d.readings.is_empty() && d.errors.is_empty(),
                "{topic}: {d:?}"
            );
            assert_eq!(d.skipped, Some(crate::decode::SKIPPED_METADATA), "{topic}");
        }
        // Retained values are stored when they changed (the default).
        let dec = decoder("homie");
        assert_eq!(
            dec.retained_rule("homie/super-car/engine/temperature"),
            crate::decode::Retained::Changed
        );
    }

    /// OPC 10000-14's own example (A.3.4.5: three DataSetWriters, one
    /// with an overall status) and fields as DataValues.
    #[test]
    fn opcua_pubsub_json() {
        let example = r#"{"MessageId":"9279c0b3-da88-45a4-af74-451cebf82db0","MessageType":"ua-data","PublisherId":"MyPublisher","Messages":[{"DataSetWriterId":101,"SequenceNumber":68468,"MinorVersion":672341762,"Timestamp":"2021-09-27T18:45:19.555Z","Payload":{"Active":true,"Temperature":25.5,"Counter":0,"AdditionalInfo":"The system is running normally (1)"}},{"DataSetWriterId":102,"SequenceNumber":25460,"MinorVersion":672341762,"Timestamp":"2021-09-27T18:45:19.555Z","Status":{"Code":1073741824},"Payload":{"LocationName":"Building A","Coordinate":{"X":0,"Y":0.2},"Measurements":[20030,20020,20010]}}]}"#;
        let at = 1_632_768_319_555;
        let d = decode(
            "opcua",
            "opcua/json/data/MyPublisher/G1",
            example,
            at + 1000,
        );
        assert!(d.errors.is_empty() && d.dropped.is_empty(), "{d:?}");
        let sensors: Vec<(&str, i64)> = d
            .readings
            .iter()
            .map(|r| (r.sensor.as_str(), r.ts_ms))
            .collect();
        assert_eq!(sensors, [("MyPublisher:101", at), ("MyPublisher:102", at)]);
        let (a, b) = (&d.readings[0], &d.readings[1]);
        assert_eq!(num(a, "Temperature"), 25.5);
        assert_eq!(field(a, "Active"), Some(&FieldValue::Bool(true)));
        assert_eq!(num(b, "StatusCode"), 1_073_741_824.0);
        assert_eq!(num(b, "Coordinate%2EY"), 0.2);
        assert_eq!(num(b, "Measurements%2E2"), 20010.0);
        // Fields as DataValues: each its own source time and status.
        let dv = r#"{"MessageType":"ua-data","PublisherId":"plc1","Messages":[{"DataSetWriterId":7,"Payload":{"Temperature":{"Value":{"Type":11,"Body":21.5},"SourceTimestamp":"2021-09-27T18:45:18.555Z"},"Pressure":{"UaType":11,"Value":1.02,"StatusCode":{"Code":1073741824,"Symbol":"Uncertain"},"SourceTimestamp":"2021-09-27T18:45:19.555Z"}}}]}"#;
        let d = decode("opcua", "opcua/json/data/plc1/G1", dv, at + 1000);
        assert!(d.errors.is_empty(), "{d:?}");
        assert_eq!(d.readings.len(), 2, "two source times: {d:?}");
        assert_eq!(
            (d.readings[0].ts_ms, num(&d.readings[0], "Temperature")),
            (at - 1000, 21.5)
        );
        let p = &d.readings[1];
        assert_eq!(num(p, "Pressure"), 1.02);
        assert_eq!(num(p, "Pressure%2EStatusCode"), 1_073_741_824.0);
        // Metadata and keep-alives store nothing, refuse nothing.
        let meta = r#"{"MessageId":"1","MessageType":"ua-metadata","PublisherId":"plc1","DataSetWriterId":7,"MetaData":{"Name":"x"}}"#;
        let d = decode("opcua", "opcua/json/metadata/plc1/G1/7", meta, at);
        assert!(d.readings.is_empty() && d.errors.is_empty(), "{d:?}");
    }

    /// EngineeringUnits from a writer's DataSetMetaData (A.3.2's message
    /// for DataSet1, its Temperature given the property in 1.05's and
    /// 1.04's encodings) go with that writer's fields, not another's.
    #[test]
    fn opcua_engineering_units_from_metadata() {
        let mut dec = decoder("opcua");
        let meta = |writer: u32, eu: &str| {
            format!(
                r#"{{"MessageId":"66D65CA4-92EE-4195-9867-E6E27794B692","MessageType":"ua-metadata","PublisherId":"MyPublisher","DataSetWriterId":{writer},"MetaData":{{"Name":"DataSet1","Fields":[{{"Name":"Active","FieldFlags":0,"BuiltInType":1,"DataType":"i=1","ValueRank":-1}},{{"Name":"Temperature","FieldFlags":0,"BuiltInType":11,"DataType":"i=11","ValueRank":-1,"Properties":[{eu}]}},{{"Name":"Counter","BuiltInType":7,"DataType":"i=7","ValueRank":-1,"Properties":[{{"Key":"EngineeringUnits","Value":{{"UaType":22,"Value":{{"UaTypeId":"i=888","UaBody":{{"UnitId":4404786}}}}}}}}]}}],"ConfigurationVersion":{{"MajorVersion":672338910,"MinorVersion":672341762}}}}}}"#
            )
        };
        let v105 = r#"{"Key":"EngineeringUnits","Value":{"UaType":22,"Value":{"UaTypeId":"i=888","UaBody":{"NamespaceUri":"http://www.opcfoundation.org/UA/units/un/cefact","UnitId":4408652,"DisplayName":{"Locale":"en","Text":"°C"},"Description":{"Locale":"en","Text":"degree Celsius"}}}}}"#;
        let v104 = r#"{"Key":{"Name":"EngineeringUnits"},"Value":{"Type":22,"Body":{"TypeId":{"Id":888},"Body":{"NamespaceUri":"http://www.opcfoundation.org/UA/units/un/cefact","UnitId":4604232,"DisplayName":{"Text":"°F"}}}}}"#;
        for (writer, eu) in [(101, v105), (102, v104)] {
            let d = dec.decode(
                "opcua/json/metadata/MyPublisher/G1/W",
                meta(writer, eu).as_bytes(),
                NOW,
            );
            assert!(d.readings.is_empty() && d.errors.is_empty(), "{d:?}");
        }
        let data = r#"{"MessageType":"ua-data","PublisherId":"MyPublisher","Messages":[{"DataSetWriterId":101,"Payload":{"Active":true,"Temperature":25.5,"Counter":3}},{"DataSetWriterId":102,"Payload":{"Temperature":77.9}},{"DataSetWriterId":103,"Payload":{"Temperature":1.5}}]}"#;
        let d = dec.decode("opcua/json/data/MyPublisher/G1", data.as_bytes(), NOW);
        let units: Vec<(&str, Vec<(String, String)>)> = d
            .readings
            .iter()
            .map(|r| (r.sensor.as_str(), r.units.clone()))
            .collect();
        let u = |f: &str, t: &str| (f.to_string(), t.to_string());
        assert_eq!(
            units,
            [
                // Counter's UnitId alone: the UNECE code it packs (C62, "one").
                (
                    "MyPublisher:101",
                    vec![u("Temperature", "°C"), u("Counter", "C62")]
                ),
                ("MyPublisher:102", vec![u("Temperature", "°F")]),
                ("MyPublisher:103", vec![]),
            ]
        );
        // New metadata replaces the writer's units.
        dec.decode(
            "opcua/json/metadata/MyPublisher/G1/W",
            meta(101, "").as_bytes(),
            NOW,
        );
        let d = dec.decode("opcua/json/data/MyPublisher/G1", data.as_bytes(), NOW);
        assert_eq!(d.readings[0].units, [u("Counter", "C62")]);
    }

    /// InfluxDB line protocol: the documentation's example line, and
    /// Telegraf's cpu lines: a sample per line, the sensor from the
    /// template, other tags as text, nanosecond times.
    #[test]
    fn line_protocol() {
        let ns = (NOW - 30_000) * 1_000_000;
        let lines = format!(
            "cpu,cpu=cpu-total,host=edge1 usage_idle=98.2,usage_user=1.1 {ns}\n\
             cpu,cpu=cpu0,host=edge1 usage_idle=97.5,usage_user=2i {ns}\n\
             \n\
             mem,host=edge1 used_percent=41.3,available=3981234176u,ok=true {}\n\
             disk,path=/ free=1",
            ns + 1_000_000_000
        );
        let d = decode("telegraf", "telegraf/edge1/cpu", &lines, NOW);
        assert_eq!(d.readings.len(), 3, "{d:?}");
        let r = &d.readings[0];
        assert_eq!((r.sensor.as_str(), r.ts_ms), ("edge1:cpu", NOW - 30_000));
        assert_eq!(
            r.fields[0],
            ("cpu".into(), FieldValue::Str("cpu-total".into()))
        );
        assert_eq!(num(r, "usage_idle"), 98.2);
        assert_eq!(num(&d.readings[1], "usage_user"), 2.0);
        let m = &d.readings[2];
        assert_eq!((m.sensor.as_str(), m.ts_ms), ("edge1:mem", NOW - 29_000));
        assert_eq!(num(m, "available"), 3_981_234_176.0);
        assert_eq!(field(m, "ok"), Some(&FieldValue::Bool(true)));
        // A line without the template's tag is refused alone.
        assert_eq!(d.errors.len(), 1);
        assert_eq!(d.errors[0].cause(), "bad_sensor");
        let bad = decode("telegraf", "telegraf/edge1/cpu", "cpu,host=a usage=", NOW);
        assert_eq!(bad.errors[0].cause(), "bad_field", "{bad:?}");
    }

    /// RFC 8428's own examples: base name, base time, base unit, relative
    /// times, records into samples by time; the issue's pack with a record
    /// named by its base name alone.
    #[test]
    fn senml_as_rfc_8428_resolves_it() {
        // Section 5.1.2, two measurements at the time of the message.
        let d = decode(
            "senml",
            "senml/dev1",
            r#"[{"bn":"urn:dev:ow:10e2073a01080063:","n":"voltage","u":"V","v":120.1},{"n":"current","u":"A","v":1.2}]"#,
            NOW,
        );
        assert!(d.errors.is_empty(), "{d:?}");
        assert_eq!(d.readings.len(), 1);
        let r = &d.readings[0];
        assert_eq!((r.sensor.as_str(), r.ts_ms), ("dev1", NOW));
        assert_eq!(num(r, "voltage"), 120.1);
        assert_eq!(num(r, "current"), 1.2);
        assert_eq!(
            r.units,
            [
                ("voltage".into(), "V".into()),
                ("current".into(), "A".into())
            ]
        );
        // Section 5.1.4 (its bt moved to today): seven records, six times.
        let bt = NOW as f64 / 1e3 - 10.0;
        let pack = format!(
            r#"[{{"bn":"urn:dev:ow:10e2073a0108006:","bt":{bt},"bu":"A","bver":5,"n":"voltage","u":"V","v":120.1}},{{"n":"current","t":-5,"v":1.2}},{{"n":"current","t":-4,"v":1.3}},{{"n":"current","t":-3,"v":1.4}},{{"n":"current","t":-2,"v":1.5}},{{"n":"current","t":-1,"v":1.6}},{{"n":"current","v":1.7}}]"#
        );
        let d = decode("senml", "senml/dev1", &pack, NOW);
        assert!(d.errors.is_empty(), "{d:?}");
        let times: Vec<i64> = d.readings.iter().map(|r| (NOW - r.ts_ms) / 1000).collect();
        assert_eq!(times, [10, 15, 14, 13, 12, 11]);
        let last = &d.readings[0];
        assert_eq!((num(last, "voltage"), num(last, "current")), (120.1, 1.7));
        assert_eq!(
            last.units,
            [
                ("voltage".into(), "V".into()),
                ("current".into(), "A".into())
            ]
        );
        // The issue's pack: told apart by name, bt the time, bu the unit.
        let pack = format!(
            r#"[{{"bn":"urn:dev:ow:10e2073a01080063:","bt":{bt},"bu":"Cel","v":23.1}},{{"n":"hum","u":"%RH","v":45}}]"#
        );
        let d = decode("senml", "senml/dev1", &pack, NOW);
        let r = &d.readings[0];
        assert_eq!(r.ts_ms, NOW - 10_000);
        assert_eq!((num(r, "value"), num(r, "hum")), (23.1, 45.0));
        assert_eq!(
            r.units,
            [("value".into(), "Cel".into()), ("hum".into(), "%RH".into())]
        );
        assert!(field(r, "bn").is_none() && field(r, "bt").is_none());
        // Must-understand labels refuse the pack; a bad name its record.
        let d = decode("senml", "senml/dev1", r#"[{"n":"t","v":1,"bx_":2}]"#, NOW);
        assert_eq!(d.errors[0].cause(), "bad_payload");
        let d = decode(
            "senml",
            "senml/dev1",
            r#"[{"n":"$bad","v":1},{"n":"ok","v":2}]"#,
            NOW,
        );
        assert_eq!((d.readings.len(), d.errors[0].cause()), (1, "bad_field"));
    }
}
