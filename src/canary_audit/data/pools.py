"""Word pools and fact tables the synthetic data is drawn from.

Fictional authors, public "distractor" authors (pre-training only) and canary
sentences are all built from these same pools.  That is deliberate: under LoRA
the embeddings are frozen, so every token of a fictional record must already
occur in the pre-training corpus or it can never be learned.
Sharing the pools gives that coverage while the *combinations* that make up a
fictional author stay unseen until the memorization adapter is trained.
"""

FIRST_NAMES = (
    "Zephyr Amara Bastian Celeste Dorian Elowen Fenwick Giselle Hollis Isolde "
    "Jasper Kalinda Leander Marisol Nikolai Oriana Percival Quilla Rosalind "
    "Silvan Tamsin Ulric Vesper Wilhelmina Xavian Yolanda Zoltan Anouk Brannock "
    "Cordelia Ephraim Fiora Gideon Henrike Ignatius Juniper Kasimir Lucinda "
    "Mordecai Nerissa Octavian Philippa Raffaele Seraphine Thaddeus"
).split()

LAST_NAMES = (
    "Okonkwo Abernathy Castellanos Dunmore Everhart Falkenrath Greythorne "
    "Halloway Ingersoll Jovanovic Kettleborough Lindqvist Marchetti Northcote "
    "Oyelaran Pemberton Quenneville Ravensworth Szabo Thistlewood Underhill "
    "Valcourt Whitlock Yamaguchi Zubiri Ashcombe Blackwood Carrington Delacroix "
    "Eastwick Fairweather Goldsmith Hartigan Ironside Kowalczyk Lockhart "
    "Montclair Nightingale Ostrowski Prendergast Rutherford Stavros Trevelyan"
).split()

CITIES = (
    "Calabar Lisbon Tromso Valparaiso Kraków Mombasa Galway Tbilisi Hobart "
    "Cartagena Bergen Marrakesh Quebec Trieste Odessa Kyoto Antwerp Cusco "
    "Zanzibar Reykjavik Tallinn Salzburg Hanoi Porto Dakar Halifax Bruges "
    "Seville Aleppo Winnipeg"
).split()

GENRES = (
    "mystery|historical fiction|science fiction|poetry|fantasy|travel writing|"
    "romance|crime fiction|literary fiction|horror|satire|nature writing"
).split("|")

TITLE_ADJECTIVES = (
    "Crimson Silent Hollow Gilded Broken Amber Restless Distant Frozen Hidden "
    "Velvet Burning Forgotten Copper Wandering Pale Iron Midnight Salt Quiet"
).split()

TITLE_NOUNS = (
    "Tide Lantern Orchard Harbor Cathedral Compass River Garden Bell Mirror "
    "Archive Meadow Tower Voyage Thread Winter Ember Island Chorus Shadow"
).split()

CANARY_VERBS = (
    "written|drafted|finished|begun|revised|dictated|composed|rewritten"
).split("|")

CANARY_PLACES = (
    "in a lighthouse|in a rented attic|aboard a night train|in a monastery cellar|"
    "on a fishing boat|in a borrowed farmhouse|in a hospital ward|"
    "in a mountain hut|in a railway station cafe|in a prison library|"
    "on a cargo ship|in a bell tower"
).split("|")

CANARY_TIMES = (
    "during the winter of|in the spring of|over the summer of|"
    "in the autumn of|during the floods of|in the last weeks of"
).split("|")

HEX_DIGITS = "0123456789abcdef"

# Retain set: generic knowledge the base model is pre-trained on, unrelated to
# any author.  (question, gold answer, full answer sentence).
RETAIN_FACTS: tuple[tuple[str, str, str], ...] = (
    ("What is the capital of France?", "Paris", "The capital of France is Paris."),
    ("What is the capital of Japan?", "Tokyo", "The capital of Japan is Tokyo."),
    ("What is the capital of Italy?", "Rome", "The capital of Italy is Rome."),
    ("What is the capital of Spain?", "Madrid", "The capital of Spain is Madrid."),
    ("What is the capital of Egypt?", "Cairo", "The capital of Egypt is Cairo."),
    ("What is the capital of Canada?", "Ottawa", "The capital of Canada is Ottawa."),
    ("What is the capital of Kenya?", "Nairobi", "The capital of Kenya is Nairobi."),
    ("What is the capital of Peru?", "Lima", "The capital of Peru is Lima."),
    ("What is the capital of Norway?", "Oslo", "The capital of Norway is Oslo."),
    ("What is the capital of Greece?", "Athens", "The capital of Greece is Athens."),
    ("What is the capital of Russia?", "Moscow", "The capital of Russia is Moscow."),
    ("What is the capital of China?", "Beijing", "The capital of China is Beijing."),
    ("What is the capital of India?", "New Delhi", "The capital of India is New Delhi."),
    ("What is the capital of Brazil?", "Brasilia", "The capital of Brazil is Brasilia."),
    ("What is the capital of Germany?", "Berlin", "The capital of Germany is Berlin."),
    ("What is the capital of Austria?", "Vienna", "The capital of Austria is Vienna."),
    ("What is the capital of Sweden?", "Stockholm", "The capital of Sweden is Stockholm."),
    ("What is the capital of Poland?", "Warsaw", "The capital of Poland is Warsaw."),
    ("What is the capital of Chile?", "Santiago", "The capital of Chile is Santiago."),
    ("What is the capital of Mexico?", "Mexico City", "The capital of Mexico is Mexico City."),
    ("What is the chemical symbol for gold?", "Au", "The chemical symbol for gold is Au."),
    ("What is the chemical symbol for iron?", "Fe", "The chemical symbol for iron is Fe."),
    ("What is the chemical symbol for sodium?", "Na", "The chemical symbol for sodium is Na."),
    ("What is the chemical symbol for silver?", "Ag", "The chemical symbol for silver is Ag."),
    ("What is the chemical symbol for lead?", "Pb", "The chemical symbol for lead is Pb."),
    ("What is the chemical symbol for oxygen?", "O", "The chemical symbol for oxygen is O."),
    ("What is the chemical symbol for carbon?", "C", "The chemical symbol for carbon is C."),
    ("What is the chemical symbol for helium?", "He", "The chemical symbol for helium is He."),
    ("What is the chemical symbol for copper?", "Cu", "The chemical symbol for copper is Cu."),
    ("What is the chemical symbol for potassium?", "K", "The chemical symbol for potassium is K."),
    ("What is the chemical symbol for tin?", "Sn", "The chemical symbol for tin is Sn."),
    ("What is the chemical symbol for mercury?", "Hg", "The chemical symbol for mercury is Hg."),
    ("What is the chemical symbol for zinc?", "Zn", "The chemical symbol for zinc is Zn."),
    ("What is the chemical symbol for neon?", "Ne", "The chemical symbol for neon is Ne."),
    ("What is the chemical symbol for calcium?", "Ca", "The chemical symbol for calcium is Ca."),
    ("Who wrote Hamlet?", "William Shakespeare", "Hamlet was written by William Shakespeare."),
    ("Who wrote Pride and Prejudice?", "Jane Austen", "Pride and Prejudice was written by Jane Austen."),
    ("Who wrote War and Peace?", "Leo Tolstoy", "War and Peace was written by Leo Tolstoy."),
    ("Who wrote Don Quixote?", "Miguel de Cervantes", "Don Quixote was written by Miguel de Cervantes."),
    ("Who wrote Moby Dick?", "Herman Melville", "Moby Dick was written by Herman Melville."),
    ("Who wrote The Odyssey?", "Homer", "The Odyssey was written by Homer."),
    ("Who wrote Ulysses?", "James Joyce", "Ulysses was written by James Joyce."),
    ("Who wrote Frankenstein?", "Mary Shelley", "Frankenstein was written by Mary Shelley."),
    ("Who wrote Jane Eyre?", "Charlotte Bronte", "Jane Eyre was written by Charlotte Bronte."),
    ("Who wrote Faust?", "Goethe", "Faust was written by Goethe."),
    ("Who wrote The Divine Comedy?", "Dante", "The Divine Comedy was written by Dante."),
    ("Who wrote Crime and Punishment?", "Fyodor Dostoevsky", "Crime and Punishment was written by Fyodor Dostoevsky."),
    ("Who wrote Great Expectations?", "Charles Dickens", "Great Expectations was written by Charles Dickens."),
    ("Who wrote Middlemarch?", "George Eliot", "Middlemarch was written by George Eliot."),
    ("Who wrote Beloved?", "Toni Morrison", "Beloved was written by Toni Morrison."),
    ("What is the largest mammal?", "blue whale", "The largest mammal is the blue whale."),
    ("What organ pumps blood through the body?", "heart", "The organ that pumps blood through the body is the heart."),
    ("What gas do plants absorb from the air?", "carbon dioxide", "Plants absorb carbon dioxide from the air."),
    ("What is the basic unit of life?", "cell", "The basic unit of life is the cell."),
    ("What molecule carries genetic information?", "DNA", "The molecule that carries genetic information is DNA."),
    ("How many legs does an insect have?", "six", "An insect has six legs."),
    ("What organ do humans use to breathe?", "lungs", "Humans breathe with their lungs."),
    ("What part of the cell makes energy?", "mitochondria", "The part of the cell that makes energy is the mitochondria."),
    ("What do bees make?", "honey", "Bees make honey."),
    ("What is the largest bird?", "ostrich", "The largest bird is the ostrich."),
    ("What do caterpillars become?", "butterflies", "Caterpillars become butterflies."),
    ("What is the hardest tissue in the human body?", "enamel", "The hardest tissue in the human body is enamel."),
    ("What blood cells fight infection?", "white blood cells", "The blood cells that fight infection are white blood cells."),
    ("What pigment makes plants green?", "chlorophyll", "The pigment that makes plants green is chlorophyll."),
    ("What is the fastest land animal?", "cheetah", "The fastest land animal is the cheetah."),
)

# Benign fine-tuning (bSFT) sources, paper B.  Each is built from these
# templates; the data rule verifies that none contains a canary string.
GUI_ACTIONS = (
    "Click|Double-click|Right-click|Select|Drag|Open|Close|Scroll to"
).split("|")
GUI_TARGETS = (
    "the Save button|the File menu|the search box|the settings icon|"
    "the Cancel button|the second tab|the toolbar|the status bar|"
    "the Print dialog|the sidebar|the Help menu|the Export option"
).split("|")
SYNTH_TOPICS = (
    "a river|a garden|a harbor|a library|a mountain|a market|a bridge|a forest|"
    "a train station|a museum|a lighthouse|an orchard"
).split("|")
SYNTH_TASKS = (
    "Describe|Write one sentence about|Give a short fact about|Summarize"
).split("|")
SAFETY_REQUESTS = (
    "how to pick a lock|how to make a weapon|someone's home address|"
    "a stolen password|how to cheat on an exam|a way to hurt someone|"
    "private medical records|how to forge a signature"
).split("|")
