import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;

import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.ConsumerGroupListing;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Kafka's own Java client (kafka-clients) against a Kafka listener, one scenario per run:
 *
 * <pre>
 *   java -cp CLASSES:KAFKA_JARS KafkaClientDriver SCENARIO BOOTSTRAP TOPIC [GROUP]
 * </pre>
 *
 * Scenarios: idempotent, transactional, group, consumer-group (the same with
 * group.protocol=consumer, KIP-848), admin. Each prints one JSON object per line
 * ({"check": name, ...facts}) for the Python test to judge, and a last line {"done": true};
 * the driver itself judges nothing, so a failure shows what the client saw. An exception a
 * check expects (an API the listener does not serve) is reported as {"error": class,
 * "message": text}; any other exception ends the run with a non-zero exit.
 */
public final class KafkaClientDriver {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Duration POLL = Duration.ofMillis(200);
    private static final long DEADLINE_MS = 60_000;

    private KafkaClientDriver() {}

    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println(
                    "usage: KafkaClientDriver idempotent|transactional|group|consumer-group|admin BOOTSTRAP TOPIC [GROUP]");
            System.exit(2);
        }
        String scenario = args[0];
        String bootstrap = args[1];
        String topic = args[2];
        switch (scenario) {
            case "idempotent" -> idempotent(bootstrap, topic);
            case "transactional" -> transactional(bootstrap, topic, args[3]);
            case "group" -> group(bootstrap, topic, args[3], "classic");
            case "consumer-group" -> group(bootstrap, topic, args[3], "consumer");
            case "admin" -> admin(bootstrap, topic, args[3]);
            default -> {
                System.err.println("unknown scenario " + scenario);
                System.exit(2);
            }
        }
        emit(Map.of("done", true));
    }

    // --- output -----------------------------------------------------------------------------

    private static synchronized void emit(Map<String, ?> fact) {
        try {
            System.out.println(JSON.writeValueAsString(fact));
            System.out.flush();
        } catch (Exception e) {
            throw new RuntimeException(e);
        }
    }

    private static Map<String, Object> check(String name) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("check", name);
        return out;
    }

    private static Map<String, Object> failure(Throwable e) {
        Throwable cause = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("error", cause.getClass().getSimpleName());
        out.put("message", String.valueOf(cause.getMessage()));
        return out;
    }

    /** Run an admin call that may be refused; its value or its error go into the fact. */
    private interface Call {
        Object run() throws Exception;
    }

    private static void attempt(String name, Call call) {
        Map<String, Object> fact = check(name);
        try {
            fact.put("value", call.run());
        } catch (Exception e) {
            fact.putAll(failure(e));
        }
        emit(fact);
    }

    private static void waitFor(String what, BooleanSupplier condition) throws InterruptedException {
        long deadline = System.currentTimeMillis() + DEADLINE_MS;
        while (!condition.getAsBoolean()) {
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException("timed out waiting for " + what);
            }
            Thread.sleep(20);
        }
    }

    // --- clients ----------------------------------------------------------------------------

    private static Properties producerProps(String bootstrap) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "60000");
        return p;
    }

    private static Properties consumerProps(String bootstrap, String isolation) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation);
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        return p;
    }

    private static Admin admin(String bootstrap) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        return Admin.create(p);
    }

    private static String text(byte[] bytes) {
        return bytes == null ? null : new String(bytes, StandardCharsets.UTF_8);
    }

    private static byte[] bytes(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    private static List<TopicPartition> partitions(KafkaConsumer<?, ?> consumer, String topic) {
        List<TopicPartition> out = new ArrayList<>();
        consumer.partitionsFor(topic).forEach(i -> out.add(new TopicPartition(topic, i.partition())));
        return out;
    }

    /** Every record of ``topic`` up to its end offsets when the read starts, through an
     * assigned consumer (no group) at ``isolation``. */
    private static List<ConsumerRecord<byte[], byte[]>> readAll(
            String bootstrap, String topic, String isolation) throws InterruptedException {
        List<ConsumerRecord<byte[], byte[]>> out = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> consumer =
                new KafkaConsumer<>(consumerProps(bootstrap, isolation))) {
            List<TopicPartition> tps = partitions(consumer, topic);
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            Map<TopicPartition, Long> ends = consumer.endOffsets(tps);
            long deadline = System.currentTimeMillis() + DEADLINE_MS;
            while (tps.stream().anyMatch(tp -> consumer.position(tp) < ends.get(tp))) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("reading " + topic + " to " + ends + " timed out");
                }
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(POLL)) {
                    out.add(r);
                }
            }
        }
        return out;
    }

    private static List<String> values(List<ConsumerRecord<byte[], byte[]>> records) {
        List<String> out = new ArrayList<>();
        records.forEach(r -> out.add(text(r.value())));
        Collections.sort(out);
        return out;
    }

    // --- idempotent producer ----------------------------------------------------------------

    /** 3,000 keyed records with headers through an idempotent acks=all producer (five requests in
     * flight), to explicit partitions; then read back by a consumer. */
    private static void idempotent(String bootstrap, String topic) throws Exception {
        int count = 3000;
        List<Future<RecordMetadata>> sends = new ArrayList<>();
        Properties props = producerProps(bootstrap);
        props.put(ProducerConfig.MAX_IN_FLIGHT_REQUESTS_PER_CONNECTION, "5");
        props.put(ProducerConfig.BATCH_SIZE_CONFIG, "4096");
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            int partitions = producer.partitionsFor(topic).size();
            for (int i = 0; i < count; i++) {
                ProducerRecord<byte[], byte[]> record = new ProducerRecord<>(
                        topic, i % partitions, 1_700_000_000_000L + i, bytes("key-" + i), bytes("value-" + i));
                record.headers().add("i", bytes(Integer.toString(i)));
                sends.add(producer.send(record));
            }
            producer.flush();
        }
        // offsets by partition, in send order: an idempotent producer keeps them in order
        Map<Integer, List<Long>> offsets = new TreeMap<>();
        for (Future<RecordMetadata> send : sends) {
            RecordMetadata m = send.get();
            offsets.computeIfAbsent(m.partition(), k -> new ArrayList<>()).add(m.offset());
        }
        Map<String, Object> sent = check("sent");
        sent.put("count", sends.size());
        boolean ascending = true;
        Map<String, Object> ranges = new TreeMap<>();
        for (Map.Entry<Integer, List<Long>> e : offsets.entrySet()) {
            List<Long> list = e.getValue();
            for (int i = 0; i < list.size(); i++) {
                ascending &= list.get(i) == i;
            }
            ranges.put(Integer.toString(e.getKey()), List.of(list.get(0), list.get(list.size() - 1)));
        }
        sent.put("offsets_dense_in_send_order", ascending);
        sent.put("ranges", ranges);
        emit(sent);

        List<ConsumerRecord<byte[], byte[]>> records = readAll(bootstrap, topic, "read_uncommitted");
        Map<String, Object> read = check("read");
        Set<String> distinct = new HashSet<>();
        boolean intact = true;
        for (ConsumerRecord<byte[], byte[]> r : records) {
            distinct.add(text(r.value()));
            String i = text(r.value()).substring("value-".length());
            Header h = r.headers().lastHeader("i");
            intact &= ("key-" + i).equals(text(r.key()))
                    && h != null && i.equals(text(h.value()))
                    && r.timestamp() == 1_700_000_000_000L + Integer.parseInt(i)
                    && r.partition() == Integer.parseInt(i) % offsets.size();
        }
        read.put("count", records.size());
        read.put("distinct", distinct.size());
        read.put("intact", intact);
        emit(read);
    }

    // --- transactional producer -------------------------------------------------------------

    /** Transactions committed and aborted (records and a group's offsets), read back at both
     * isolation levels; then a second producer with the same transactional id fences the
     * first. */
    private static void transactional(String bootstrap, String topic, String group) throws Exception {
        String txnId = topic + "-txn";
        Properties props = producerProps(bootstrap);
        props.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        props.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "30000");
        TopicPartition tp0 = new TopicPartition(topic, 0);
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            producer.initTransactions();
            producer.beginTransaction();
            for (int i = 0; i < 10; i++) {
                producer.send(new ProducerRecord<>(topic, i % 2, null, bytes("committed-" + i)));
            }
            producer.sendOffsetsToTransaction(
                    Map.of(tp0, new OffsetAndMetadata(10, "first")), new ConsumerGroupMetadata(group));
            producer.commitTransaction();
            emit(committedOffsets(bootstrap, group, tp0, "after_commit"));

            producer.beginTransaction();
            for (int i = 0; i < 5; i++) {
                producer.send(new ProducerRecord<>(topic, i % 2, null, bytes("aborted-" + i)));
            }
            producer.sendOffsetsToTransaction(
                    Map.of(tp0, new OffsetAndMetadata(99, "aborted")), new ConsumerGroupMetadata(group));
            producer.flush();
            producer.abortTransaction();
            emit(committedOffsets(bootstrap, group, tp0, "after_abort"));

            producer.beginTransaction();
            for (int i = 10; i < 13; i++) {
                producer.send(new ProducerRecord<>(topic, i % 2, null, bytes("committed-" + i)));
            }
            producer.commitTransaction();

            // an open transaction holds read_committed readers back (the LSO) until it ends
            producer.beginTransaction();
            producer.send(new ProducerRecord<>(topic, 0, null, bytes("open-0"))).get();
            Map<String, Object> open = check("open");
            open.put("read_committed", values(readAll(bootstrap, topic, "read_committed")));
            emit(open);

            // a second producer with the same transactional id fences the first (a zombie)
            Map<String, Object> fence = check("fenced");
            try (KafkaProducer<byte[], byte[]> successor = new KafkaProducer<>(props)) {
                successor.initTransactions(); // aborts the open transaction
                try {
                    producer.send(new ProducerRecord<>(topic, 0, null, bytes("zombie-0"))).get();
                    producer.commitTransaction();
                    fence.put("zombie_committed", true);
                } catch (ProducerFencedException e) {
                    fence.putAll(failure(e));
                } catch (ExecutionException e) {
                    fence.putAll(failure(e));
                }
                successor.beginTransaction();
                successor.send(new ProducerRecord<>(topic, 1, null, bytes("successor-0")));
                successor.commitTransaction();
            }
            emit(fence);
        } catch (ProducerFencedException e) {
            // close() of a fenced producer may raise it again
        }
        Map<String, Object> read = check("read");
        read.put("read_committed", values(readAll(bootstrap, topic, "read_committed")));
        read.put("read_uncommitted", values(readAll(bootstrap, topic, "read_uncommitted")));
        emit(read);
    }

    private static Map<String, Object> committedOffsets(
            String bootstrap, String group, TopicPartition tp, String name) throws Exception {
        Map<String, Object> fact = check(name);
        try (Admin admin = admin(bootstrap)) {
            OffsetAndMetadata committed =
                    admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get().get(tp);
            fact.put("offset", committed == null ? null : committed.offset());
            fact.put("metadata", committed == null ? null : committed.metadata());
        }
        return fact;
    }

    // --- consumer group, classic protocol ----------------------------------------------------

    /** One member of a group (classic or consumer protocol), polling in its own thread. */
    private static final class Member implements Runnable {
        final String name;
        final KafkaConsumer<byte[], byte[]> consumer;
        final String topic;
        final Map<String, String> consumed; // "partition:offset" -> member
        final Set<TopicPartition> assignment = ConcurrentHashMap.newKeySet();
        final AtomicInteger generations = new AtomicInteger();
        final AtomicBoolean stop = new AtomicBoolean();
        final AtomicInteger duplicates;
        volatile Throwable failed;
        final Thread thread;

        Member(String name, String bootstrap, String topic, String group, String protocol,
                Map<String, String> consumed, AtomicInteger duplicates) {
            Properties p = consumerProps(bootstrap, "read_committed");
            p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
            p.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, protocol);
            p.put(ConsumerConfig.CLIENT_ID_CONFIG, name);
            p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "50");
            if (protocol.equals("classic")) { // the broker sets these for the consumer protocol
                p.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
                p.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "500");
            }
            this.name = name;
            this.topic = topic;
            this.consumed = consumed;
            this.duplicates = duplicates;
            this.consumer = new KafkaConsumer<>(p);
            this.thread = new Thread(this, name);
        }

        @Override
        public void run() {
            try {
                consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                    @Override
                    public void onPartitionsRevoked(Collection<TopicPartition> revoked) {
                        consumer.commitSync(); // what this member read, before another reads on
                        assignment.removeAll(revoked);
                    }

                    @Override
                    public void onPartitionsAssigned(Collection<TopicPartition> assigned) {
                        assignment.addAll(assigned);
                        generations.incrementAndGet();
                        Map<String, Object> fact = check("assigned");
                        fact.put("member", name);
                        fact.put("partitions", sorted(assignment));
                        emit(fact);
                    }
                });
                while (!stop.get()) {
                    ConsumerRecords<byte[], byte[]> records = consumer.poll(POLL);
                    for (ConsumerRecord<byte[], byte[]> r : records) {
                        if (consumed.put(r.partition() + ":" + r.offset(), name) != null) {
                            duplicates.incrementAndGet();
                        }
                    }
                    if (!records.isEmpty()) {
                        consumer.commitSync();
                    }
                }
                consumer.commitSync();
            } catch (Throwable e) {
                failed = e;
                e.printStackTrace();
            } finally {
                consumer.close(); // leaves the group (LeaveGroup)
            }
        }
    }

    private static List<Integer> sorted(Collection<TopicPartition> tps) {
        List<Integer> out = new ArrayList<>();
        tps.forEach(tp -> out.add(tp.partition()));
        Collections.sort(out);
        return out;
    }

    /** Two members of a group (``protocol``: classic or consumer): the first takes every partition, the second joins and
     * they split them, the second leaves and the first takes them all back; every record
     * consumed once, and the group's committed offsets at the log end. */
    private static void group(String bootstrap, String topic, String group, String protocol)
            throws Exception {
        int partitions;
        int count = 2000;
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps(bootstrap))) {
            partitions = producer.partitionsFor(topic).size();
            for (int i = 0; i < count / 2; i++) {
                producer.send(new ProducerRecord<>(topic, i % partitions, null, bytes("a-" + i)));
            }
            producer.flush();
            Map<String, String> consumed = new ConcurrentHashMap<>();
            AtomicInteger duplicates = new AtomicInteger();
            Member a = new Member("member-a", bootstrap, topic, group, protocol, consumed, duplicates);
            a.thread.start();
            waitFor("member-a to get every partition", () -> a.assignment.size() == partitions);
            waitFor("member-a to read what was sent", () -> consumed.size() >= count / 2);

            Member b = new Member("member-b", bootstrap, topic, group, protocol, consumed, duplicates);
            b.thread.start();
            waitFor("the two members to split the partitions", () -> !b.assignment.isEmpty()
                    && a.assignment.size() + b.assignment.size() == partitions);
            Map<String, Object> split = check("split");
            split.put("a", sorted(a.assignment));
            split.put("b", sorted(b.assignment));
            emit(split);

            try (Admin admin = admin(bootstrap)) {
                ConsumerGroupDescription d =
                        admin.describeConsumerGroups(List.of(group)).all().get().get(group);
                Map<String, Object> described = check("described");
                described.put("state", d.groupState().toString());
                described.put("protocol", d.type().toString());
                described.put("assignor", d.partitionAssignor());
                List<Map<String, Object>> members = new ArrayList<>();
                for (MemberDescription m : d.members()) {
                    members.add(Map.of("client_id", m.clientId(),
                            "partitions", sorted(m.assignment().topicPartitions())));
                }
                members.sort((x, y) -> String.valueOf(x.get("client_id")).compareTo(String.valueOf(y.get("client_id"))));
                described.put("members", members);
                emit(described);
            }

            for (int i = count / 2; i < count; i++) {
                producer.send(new ProducerRecord<>(topic, i % partitions, null, bytes("b-" + i)));
            }
            producer.flush();
            waitFor("the members to read everything", () -> consumed.size() >= count);
            Map<String, Object> both = check("both_read");
            both.put("a", consumed.values().stream().filter("member-a"::equals).count());
            both.put("b", consumed.values().stream().filter("member-b"::equals).count());
            emit(both);

            b.stop.set(true);
            b.thread.join(DEADLINE_MS);
            waitFor("member-a to take every partition back", () -> a.assignment.size() == partitions
                    && a.generations.get() >= 3);
            Map<String, Object> back = check("rejoined");
            back.put("a", sorted(a.assignment));
            emit(back);
            a.stop.set(true);
            a.thread.join(DEADLINE_MS);

            Map<String, Object> result = check("consumed");
            result.put("count", consumed.size());
            result.put("duplicates", duplicates.get());
            result.put("failed", a.failed == null && b.failed == null ? null
                    : String.valueOf(a.failed != null ? a.failed : b.failed));
            emit(result);
        }
        try (Admin admin = admin(bootstrap)) {
            Map<TopicPartition, OffsetAndMetadata> offsets =
                    admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
            Map<String, Object> committed = check("committed");
            Map<String, Long> byPartition = new TreeMap<>();
            offsets.forEach((tp, o) -> byPartition.put(Integer.toString(tp.partition()), o.offset()));
            committed.put("offsets", byPartition);
            Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
            offsets.keySet().forEach(tp -> latest.put(tp, OffsetSpec.latest()));
            Map<String, Long> ends = new TreeMap<>();
            admin.listOffsets(latest).all().get()
                    .forEach((tp, info) -> ends.put(Integer.toString(tp.partition()), info.offset()));
            committed.put("ends", ends);
            committed.put("state",
                    admin.describeConsumerGroups(List.of(group)).all().get().get(group).groupState().toString());
            emit(committed);
        }
    }

    // --- AdminClient --------------------------------------------------------------------------

    /** The AdminClient calls Kafka's tools and UIs make, each a fact (value or error). */
    @SuppressWarnings("deprecation")
    private static void admin(String bootstrap, String topic, String group) throws Exception {
        try (Admin admin = admin(bootstrap)) {
            attempt("describe_cluster", () -> {
                DescribeClusterResult c = admin.describeCluster();
                Map<String, Object> v = new LinkedHashMap<>();
                v.put("cluster_id", c.clusterId().get());
                v.put("controller", c.controller().get().id());
                List<Integer> nodes = new ArrayList<>();
                for (Node n : c.nodes().get()) {
                    nodes.add(n.id());
                }
                Collections.sort(nodes);
                v.put("nodes", nodes);
                return v;
            });
            attempt("create_topics", () -> {
                NewTopic t = new NewTopic(topic, 3, (short) 3)
                        .configs(Map.of("retention.ms", "86400000", "min.insync.replicas", "2"));
                admin.createTopics(List.of(t)).all().get();
                return true;
            });
            attempt("create_existing", () -> {
                admin.createTopics(List.of(new NewTopic(topic, 3, (short) 3))).all().get();
                return true;
            });
            // a new topic reaches each broker's metadata on its own: ask until it shows
            attempt("list_topics", () -> {
                long deadline = System.currentTimeMillis() + DEADLINE_MS;
                while (!admin.listTopics().names().get().contains(topic)) {
                    if (System.currentTimeMillis() > deadline) {
                        return false;
                    }
                    Thread.sleep(50);
                }
                return true;
            });
            waitFor("every partition of " + topic + " to have a leader", () -> {
                try {
                    TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
                    return d.partitions().stream().allMatch(p -> p.leader() != null && !p.leader().isEmpty());
                } catch (Exception e) {
                    return false;
                }
            });
            attempt("describe_topics", () -> {
                TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
                List<Map<String, Object>> parts = new ArrayList<>();
                for (TopicPartitionInfo p : d.partitions()) {
                    parts.add(Map.of("partition", p.partition(), "replicas", p.replicas().size(),
                            "isr", p.isr().size()));
                }
                return Map.of("name", d.name(), "internal", d.isInternal(), "partitions", parts,
                        "topic_id", d.topicId().toString());
            });
            ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
            attempt("describe_configs", () -> {
                // a broker learns the new topic from the cluster metadata on its own, as Kafka's
                // do: one that has not yet answers UnknownTopicOrPartition (retriable); ask again until the
                // deadline
                long deadline = System.currentTimeMillis() + DEADLINE_MS;
                Config config;
                while (true) {
                    try {
                        config = admin.describeConfigs(List.of(resource)).all().get().get(resource);
                        break;
                    } catch (ExecutionException e) {
                        if (!(e.getCause() instanceof RetriableException)
                                || System.currentTimeMillis() > deadline) {
                            throw e;
                        }
                        Thread.sleep(100);
                    }
                }
                Map<String, Object> v = new TreeMap<>();
                for (String name : List.of("retention.ms", "min.insync.replicas", "segment.bytes")) {
                    ConfigEntry e = config.get(name);
                    v.put(name, e == null ? null : Map.of("value", String.valueOf(e.value()),
                            "source", e.source().toString()));
                }
                return v;
            });
            attempt("incremental_alter_configs", () -> {
                admin.incrementalAlterConfigs(Map.of(resource, List.of(
                        new AlterConfigOp(new ConfigEntry("retention.ms", "3600000"), AlterConfigOp.OpType.SET),
                        new AlterConfigOp(new ConfigEntry("min.insync.replicas", ""), AlterConfigOp.OpType.DELETE))))
                        .all().get();
                // the change is committed by the controller; each broker learns it from the
                // cluster metadata on its own (as Kafka's do), so a describe may go to one
                // that has not yet: ask until it shows, within the deadline
                long deadline = System.currentTimeMillis() + DEADLINE_MS;
                while (true) {
                    Config config = admin.describeConfigs(List.of(resource)).all().get().get(resource);
                    Map<String, Object> seen = Map.of("retention.ms", config.get("retention.ms").value(),
                            "min.insync.replicas", config.get("min.insync.replicas").source().toString());
                    if ("3600000".equals(seen.get("retention.ms"))
                            && "DEFAULT_CONFIG".equals(seen.get("min.insync.replicas"))
                            || System.currentTimeMillis() > deadline) {
                        return seen;
                    }
                    Thread.sleep(50);
                }
            });
            attempt("describe_broker_configs", () -> {
                ConfigResource broker = new ConfigResource(ConfigResource.Type.BROKER, "0");
                Config config = admin.describeConfigs(List.of(broker)).all().get().get(broker);
                return config.entries().size() > 0;
            });
            attempt("create_partitions", () -> {
                admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(4))).all().get();
                long deadline = System.currentTimeMillis() + DEADLINE_MS;
                while (true) {
                    int n = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic).partitions().size();
                    if (n == 4 || System.currentTimeMillis() > deadline) {
                        return n;
                    }
                    Thread.sleep(50);
                }
            });

            TopicPartition tp0 = new TopicPartition(topic, 0);
            Properties props = producerProps(bootstrap);
            try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
                for (int i = 0; i < 100; i++) {
                    producer.send(new ProducerRecord<>(topic, 0, 1_700_000_000_000L + i * 1000L, null, bytes("r-" + i)));
                }
                producer.flush();
            }
            attempt("list_offsets", () -> {
                Map<String, Object> v = new LinkedHashMap<>();
                v.put("earliest", admin.listOffsets(Map.of(tp0, OffsetSpec.earliest())).all().get().get(tp0).offset());
                v.put("latest", admin.listOffsets(Map.of(tp0, OffsetSpec.latest())).all().get().get(tp0).offset());
                ListOffsetsResult.ListOffsetsResultInfo at = admin.listOffsets(
                        Map.of(tp0, OffsetSpec.forTimestamp(1_700_000_000_000L + 42_500L))).all().get().get(tp0);
                v.put("for_timestamp", at.offset());
                v.put("for_timestamp_ts", at.timestamp());
                return v;
            });
            attempt("list_offsets_max_timestamp", () ->
                    admin.listOffsets(Map.of(tp0, OffsetSpec.maxTimestamp())).all().get().get(tp0).offset());
            attempt("delete_records", () -> {
                long low = admin.deleteRecords(Map.of(tp0, RecordsToDelete.beforeOffset(30)))
                        .lowWatermarks().get(tp0).get().lowWatermark();
                long earliest = admin.listOffsets(Map.of(tp0, OffsetSpec.earliest())).all().get().get(tp0).offset();
                return Map.of("low_watermark", low, "earliest", earliest);
            });

            // a group with committed offsets, then listed, described, altered and deleted
            attempt("alter_group_offsets", () -> {
                admin.alterConsumerGroupOffsets(group, Map.of(tp0, new OffsetAndMetadata(40, "admin")))
                        .all().get();
                return admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get()
                        .get(tp0).offset();
            });
            attempt("list_consumer_groups", () -> {
                List<String> ids = new ArrayList<>();
                for (ConsumerGroupListing l : admin.listConsumerGroups().all().get()) {
                    ids.add(l.groupId());
                }
                return ids.contains(group);
            });
            attempt("describe_consumer_groups", () -> {
                ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(group)).all().get().get(group);
                return Map.of("state", d.groupState().toString(), "members", d.members().size());
            });
            attempt("delete_group_offsets", () -> {
                admin.deleteConsumerGroupOffsets(group, Set.of(tp0)).all().get();
                // the empty group's offset of tp0 is gone: listed again, the group has none
                return admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get()
                        .containsKey(tp0);
            });
            attempt("delete_consumer_groups", () -> {
                admin.deleteConsumerGroups(List.of(group)).all().get();
                List<String> ids = new ArrayList<>();
                for (ConsumerGroupListing l : admin.listConsumerGroups().all().get()) {
                    ids.add(l.groupId());
                }
                return !ids.contains(group);
            });
            attempt("list_partition_reassignments", () ->
                    admin.listPartitionReassignments().reassignments().get().size());

            // the log-dir, producer, ACL and SCRAM calls; describeMetadataQuorum's is refused clearly
            attempt("describe_log_dirs", () -> admin.describeLogDirs(List.of(0)).allDescriptions().get().size());
            attempt("describe_producers", () ->
                    admin.describeProducers(List.of(tp0)).all().get().get(tp0).activeProducers().size());
            attempt("list_transactions", () -> admin.listTransactions().all().get().size());
            attempt("describe_acls", () ->
                    admin.describeAcls(org.apache.kafka.common.acl.AclBindingFilter.ANY).values().get().size());
            attempt("describe_user_scram_credentials", () ->
                    admin.describeUserScramCredentials().all().get().size());
            attempt("describe_metadata_quorum", () ->
                    admin.describeMetadataQuorum().quorumInfo().get().leaderId());

            attempt("delete_topics", () -> {
                admin.deleteTopics(List.of(topic)).all().get();
                long deadline = System.currentTimeMillis() + DEADLINE_MS;
                while (admin.listTopics().names().get().contains(topic)) {
                    if (System.currentTimeMillis() > deadline) {
                        return false;
                    }
                    Thread.sleep(50);
                }
                return true;
            });
        }
    }
}
