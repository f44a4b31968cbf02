"""Regenerate the bundled sample site in pipeline/crawl/sample_site/ (the demo's crawl target).

The articles are original prose written for this project. The site deliberately includes pages the
pipeline must handle: an exact mirror of an article, a page too short to keep, a page in Chinese,
a robots.txt-disallowed folder, and a link to a missing page.
"""

import html
import shutil
from pathlib import Path

SITE = Path(__file__).resolve().parents[1] / "pipeline" / "crawl" / "sample_site"

ARTICLES = {
    "river-mills": (
        "How river mills shaped small towns",
        [
            "Before steam engines and electric motors, a river was the most reliable source of power a village could hope for. Millers built weirs to raise the water level, then guided part of the flow through a narrow channel called a leat. At the end of that channel a wheel turned, and the wheel drove the stones that ground grain into flour.",
            "Because the mill needed steady water, towns grew along the banks where the current was strong but not violent. Bakers, brewers and weavers settled close by, since they all depended on the miller or on the same moving water. Roads followed the river, bridges followed the roads, and markets appeared wherever the bridges crossed.",
            "The arrangement was not always peaceful. A miller upstream could hold back water and starve the wheels below him, so many regions wrote careful rules about how high a weir might stand and when the sluices had to open. Some of those rules survived for centuries and still appear in modern water law.",
            "When you walk through an old river town today, look for the signs. A street named after the mill, a stone channel that now carries nothing but rain, or a row of houses that follows the curve of a vanished leat can tell you where the town first found its power.",
        ],
    ),
    "night-sky": (
        "A beginner's guide to the night sky",
        [
            "You do not need a telescope to start learning the sky. A dark place away from street lights, a warm coat and twenty minutes of patience are enough. Your eyes need that time to adapt, and the number of stars you can see will grow steadily while you wait.",
            "Begin with the brightest patterns. In the northern hemisphere the Plough is easy to find, and two of its stars point toward the Pole Star, which barely moves during the night. Once you know where north is, the other constellations become landmarks you can return to every season.",
            "Planets look like stars at first, but they do not twinkle as much and they wander slowly against the background over the weeks. Venus is often the brightest object after the Moon, shining low in the west after sunset or in the east before dawn. Jupiter is bright as well, and a pair of ordinary binoculars will show its four largest moons as tiny points in a line.",
            "Keep a simple notebook. Write the date, the time and what you saw, even if it was only a few stars between the clouds. After a year you will have a record of how the sky turns with the seasons, and you will know it far better than any chart could teach you.",
        ],
    ),
    "sourdough": (
        "Keeping a sourdough starter alive",
        [
            "A sourdough starter is a small community of wild yeast and bacteria living in a paste of flour and water. The yeast makes the gas that lifts the bread, while the bacteria produce the acids that give sourdough its flavour. Keeping the starter healthy is mostly a matter of feeding it regularly and keeping it at a sensible temperature.",
            "Most bakers feed their starter once a day when they bake often. They discard part of it, then add fresh flour and water in equal weights. If you bake only on weekends, the starter can live in the refrigerator and be fed once a week, although it will need a day or two of warm feeding before it is lively again.",
            "Watch the starter rather than the clock. A healthy one roughly doubles in size a few hours after feeding, with bubbles throughout and a pleasant sour smell. If it smells sharply of nail varnish, it is hungry. If a grey liquid collects on top, pour it off and feed the starter a little more generously.",
            "Do not be afraid of mistakes. Starters are remarkably forgiving, and one that seems weak will usually recover after a few regular feedings. Many bakers keep the same culture for years and share spoonfuls of it with friends who want to begin.",
        ],
    ),
    "bicycle-repair": (
        "Fixing a flat bicycle tyre at the roadside",
        [
            "A puncture is the most common problem a cyclist meets, and it is one of the easiest to repair. Carry a spare inner tube, two tyre levers and a small pump, and you can be riding again within fifteen minutes.",
            "First remove the wheel. Open the brake if needed, release the quick release or loosen the axle nuts, and lift the wheel out of the frame. Let any remaining air out of the tube, then push one tyre lever under the edge of the tyre and hook it onto a spoke. A second lever a little further along will free the bead, and you can run it around the rim by hand.",
            "Before fitting the new tube, run your fingers carefully around the inside of the tyre. The thorn or sliver of glass that caused the puncture is often still there, and it will puncture the new tube as soon as you ride. Remove it, then put a little air into the new tube so that it holds its shape.",
            "Tuck the tube into the tyre, starting at the valve, and work the bead back onto the rim with your thumbs. Avoid using the levers for this step, because they can pinch the tube. Pump the tyre to the pressure printed on its sidewall, refit the wheel, close the brake and check that everything spins freely.",
        ],
    ),
    "honeybees": (
        "What honeybees do in winter",
        [
            "Honeybees do not hibernate. When the weather turns cold, the colony gathers into a tight ball around the queen and the stored honey. The bees on the inside shiver their flight muscles without moving their wings, which produces heat and keeps the centre of the cluster warm even on freezing nights.",
            "The outer layer of bees acts as insulation. They pack closely together with their heads pointing inward, and over the course of the winter they slowly rotate with the bees inside, so that no single bee stays cold for too long. The whole cluster drifts across the comb as it eats its way through the honey stores.",
            "A strong colony needs a good amount of honey to survive until spring, and beekeepers check the weight of their hives in autumn. If the stores are light, they may feed the bees with thick sugar syrup before the weather becomes too cold for the bees to process it.",
            "On mild, sunny winter days you may see bees flying briefly near the entrance. They are not collecting food, since few flowers are open, but making cleansing flights. It is a good sign, because it tells the beekeeper that the colony inside is still alive and active.",
        ],
    ),
    "tide-pools": (
        "Exploring tide pools safely",
        [
            "When the sea retreats at low tide, it leaves behind pools of water among the rocks, and each one is a small world of its own. Anemones, crabs, snails, small fish and seaweed all survive there until the water returns, and a patient visitor can watch them going about their business.",
            "Check a tide table before you go, and plan to arrive about an hour before low water. That gives you time to explore and leaves plenty of margin before the tide turns. It is easy to lose track of time while searching under ledges, and the sea comes back faster than most people expect.",
            "Wear shoes with a good grip, because wet rock and seaweed are slippery. Move slowly and step on bare rock rather than on living things. If you lift a stone to look underneath it, put it back exactly as you found it, since the animals sheltering there depend on the shade and moisture.",
            "Resist the temptation to carry creatures home. Most of them cannot live in a bucket for long, and the pool is the only place where they can find the food and the changing water they need. A photograph and a sketch in a notebook are better souvenirs.",
        ],
    ),
    "compost": (
        "Making good compost at home",
        [
            "Compost turns kitchen scraps and garden waste into a dark, crumbly material that feeds the soil. The process is carried out by bacteria, fungi, worms and insects, and your job is simply to give them the right mixture of food, air and moisture.",
            "Aim for a balance between green and brown materials. Green materials such as grass clippings, vegetable peelings and coffee grounds are rich in nitrogen. Brown materials such as dry leaves, straw and shredded cardboard provide carbon. A heap made only of grass becomes slimy and smelly, while a heap made only of leaves breaks down very slowly.",
            "Turn the heap every few weeks with a fork. Turning lets air into the middle, and the organisms that work fastest need oxygen. The heap should feel as damp as a wrung out sponge, so add water in dry weather and more brown material if it becomes too wet.",
            "Depending on the season and how often you turn it, the compost will be ready in a few months to a year. It is finished when it smells of earth and you can no longer recognise the original ingredients. Spread it on beds in spring, and your plants will reward you with healthy growth.",
        ],
    ),
    "old-maps": (
        "Reading old maps for local history",
        [
            "Old maps are some of the most useful sources for anyone researching the history of a neighbourhood. They show which buildings stood at a given time, how fields were divided, where streams ran before they were covered, and what names people used for places that have since changed.",
            "Start by comparing maps from different decades of the same area. Lay them side by side and look for what appears and disappears. A row of cottages may give way to a factory, and the factory may give way to a school. Each change hints at a story you can follow in newspapers, directories or parish records.",
            "Be careful with details. Mapmakers copied from earlier surveys, and a building may appear on a map years after it was demolished. Symbols also changed over time, so a mark that means a windmill on one edition may mean something else on another. The key printed on the sheet is your best guide.",
            "Many libraries and archives now offer scanned maps that you can view online or in their reading rooms. Ask the staff for help, since they often know which surveys cover your street and which ones are most accurate for the period that interests you.",
        ],
    ),
    "learning-chess": (
        "Simple habits that improve your chess",
        [
            "Many players hope that learning more openings will make them stronger, but most games between beginners are decided by simple mistakes. A few steady habits will win you more points than memorising long sequences of moves.",
            "Before every move, ask what your opponent's last move threatens. Look for checks, captures and attacks on undefended pieces. This one question prevents a large share of the blunders that lose games, and it becomes automatic after a few weeks of practice.",
            "Next, look at your own forcing moves. If you can give check, capture something safely or attack two pieces at once, consider that option first. Tactics often appear suddenly, and players who search for them regularly find far more of them than players who rely on inspiration.",
            "Finally, review your games after you play them, especially the ones you lose. Find the moment where the position went wrong and try to understand why. Writing down one lesson from each game will turn every defeat into progress.",
        ],
    ),
    "rainwater": (
        "Collecting rainwater for the garden",
        [
            "A single roof collects a surprising amount of water. During one heavy storm, even a small shed can fill a large barrel, and that water is free, soft and at the right temperature for plants. Collecting it also reduces the load on drains during wet weather.",
            "The simplest system is a water butt connected to a downpipe with a diverter. The diverter sends water into the butt until it is full, then lets the rest continue down the drain. Place the butt on a firm stand so that a watering can fits under its tap.",
            "Keep a lid on the butt to stop leaves, insects and children getting in, and to keep the water dark, which discourages algae. Clean the gutters each autumn, since debris from the roof ends up in the barrel and makes the water smell.",
            "Rainwater is ideal for watering pots, seedlings and plants that dislike lime, such as blueberries and camellias. It is not safe to drink without treatment, so label the tap clearly if the garden is used by visitors or young children.",
        ],
    ),
    "trains-timetables": (
        "Why railway timetables matter",
        [
            "Railway timetables did more than tell passengers when to arrive at the station. In the early days of railways, every town kept its own local time based on the position of the sun, which made it almost impossible to publish a timetable that worked along a whole line.",
            "To solve the problem, railway companies adopted a single standard time for their networks. Clocks at stations were set by telegraph signals from a central observatory, and towns gradually followed the railway rather than the sun. Standard time zones grew out of this practical need.",
            "A good timetable is also a careful piece of engineering. Planners must fit fast and slow trains onto the same tracks, leave time for passengers to change trains, and allow for the possibility of delays. A small change in one place can ripple across an entire network.",
            "The next time you check a departure board, remember that the neat columns of numbers represent decades of compromise between speed, safety, and the needs of the people waiting on the platform.",
        ],
    ),
    "mushrooms": (
        "Understanding mushrooms without picking them",
        [
            "The mushrooms we see in autumn are only the fruiting bodies of much larger organisms. Most of a fungus lives underground or inside wood as a network of fine threads, and it may spread across a wide area for many years before producing a single mushroom.",
            "Many fungi form partnerships with trees. Their threads wrap around the roots and trade minerals and water for sugars that the tree produces from sunlight. A walk through an old forest is also a walk above an enormous living network that links the trees together.",
            "Identifying mushrooms is difficult, and some deadly species look very similar to edible ones. The safest way to enjoy them is to photograph them, note where they grow and which trees stand nearby, and compare your notes with a good field guide or a local recording group.",
            "By observing instead of collecting, you leave the fungi to release their spores, and you may find the same mushrooms in the same place each year. Over time your records can even help scientists understand how fungi respond to changes in the climate.",
        ],
    ),
}

CHINESE = (
    "茶的故事",
    [
        "茶起源于中国，已有数千年的历史。最初，人们把茶叶当作药材，用来提神和解渴。后来，喝茶逐渐成为日常生活的一部分，并传播到世界各地。",
        "不同地区的茶有不同的风味。绿茶清新，红茶浓郁，乌龙茶介于两者之间。泡茶时，水温和时间都很重要，过热的水会让绿茶变苦。",
        "今天，很多人仍然喜欢在安静的午后泡一壶茶，和朋友聊天，或者一个人慢慢品味。",
    ],
)

NAV = '<nav class="menu"><a href="/index.html">Home</a> | <a href="/about.html">About</a> | <a href="/archive/">Archive</a></nav>'
FOOTER = (
    "<footer><p>Copyright 2026 The Sample Almanac. All rights reserved.</p>"
    '<p class="cookie">We use cookies to improve your experience. By using this site you accept our cookie policy.</p></footer>'
)


def page(title: str, paragraphs: list[str], lang: str = "en", links: list[tuple[str, str]] = ()) -> str:
    body = "\n".join(f"<p>{html.escape(p)}</p>" for p in paragraphs)
    related = "".join(f'<li><a href="{href}">{html.escape(text)}</a></li>' for href, text in links)
    return f"""<!DOCTYPE html>
<html lang="{lang}">
<head><meta charset="utf-8"><title>{html.escape(title)} - The Sample Almanac</title></head>
<body>
{NAV}
<main><article>
<h1>{html.escape(title)}</h1>
{body}
</article>
<aside><h2>Related</h2><ul>{related}</ul></aside>
</main>
{FOOTER}
</body>
</html>
"""


def main() -> None:
    if SITE.exists():
        shutil.rmtree(SITE)
    (SITE / "articles").mkdir(parents=True)
    (SITE / "mirror").mkdir()
    (SITE / "private").mkdir()
    (SITE / "archive").mkdir()
    slugs = list(ARTICLES)
    for position, slug in enumerate(slugs):
        title, paragraphs = ARTICLES[slug]
        neighbours = [slugs[(position + step) % len(slugs)] for step in (1, 2)]
        links = [(f"/articles/{other}.html", ARTICLES[other][0]) for other in neighbours]
        (SITE / "articles" / f"{slug}.html").write_text(page(title, paragraphs, links=links))
    # An exact copy under another URL: the clean stage must keep only one.
    (SITE / "mirror" / "river-mills.html").write_text((SITE / "articles" / "river-mills.html").read_text())
    (SITE / "articles" / "tea.html").write_text(page(*CHINESE, lang="zh"))
    (SITE / "about.html").write_text(page("About", ["A small almanac of useful things."]))
    (SITE / "private" / "secret.html").write_text(
        page("Private", ["This page is disallowed by robots.txt."] * 20)
    )
    archive_links = "".join(
        f'<li><a href="/articles/{s}.html">{html.escape(ARTICLES[s][0])}</a></li>' for s in slugs
    )
    (SITE / "archive" / "index.html").write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Archive</title></head><body>{NAV}"
        f"<ul>{archive_links}<li><a href='/articles/tea.html'>茶的故事</a></li>"
        f"<li><a href='/mirror/river-mills.html'>Mirror</a></li></ul>{FOOTER}</body></html>\n"
    )
    index_links = "".join(
        f'<li><a href="/articles/{s}.html">{html.escape(ARTICLES[s][0])}</a></li>' for s in slugs[:4]
    )
    (SITE / "index.html").write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>The Sample Almanac</title></head><body>{NAV}"
        f"<h1>The Sample Almanac</h1><ul>{index_links}</ul>"
        f"<p><a href='/private/secret.html'>Members only</a> | <a href='/missing.html'>Old link</a></p>{FOOTER}</body></html>\n"
    )
    (SITE / "robots.txt").write_text("User-agent: *\nDisallow: /private/\n")


if __name__ == "__main__":
    main()
